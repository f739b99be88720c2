"""Random-weight models of real shapes and their GGUF files, made with llama.cpp's own tools:
a wrapper of ../shared/peers/scale_models.py (the HF folder) and scale-models.sh (llama.cpp's
convert_hf_to_gguf.py, then llama-quantize), plus shapes of our own:

- qwen3-30b-a3b-<N>l: Qwen3-30B-A3B's layer shape (hidden 2048, 32 heads / 4 KV heads of 128,
  128 experts of 768 features, top 8, renormalised) with N of its 48 layers, so it fits this
  machine: every expert's shape and the bytes a token reads per layer are the real model's.

    python -m bench.scale_models --llama-cpp /tmp/anchor-llamacpp --out /tmp/scale \\
        --models qwen3-30b-a3b-4l --types Q4_K_M

Writes <out>/<model>-random-hf/, <out>/<model>-bf16.gguf and <out>/<model>-<TYPE>.gguf (each
step skips files that exist). The vocabulary and tokenizer are the default model's.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "peers"

QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json, vocab, token ids and layer count aside
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "attention_bias": False, "attention_dropout": 0.0, "decoder_sparse_step": 1,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
    "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
    "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "use_cache": True,
    "use_sliding_window": False,
}


def shared_scale_models():
    spec = importlib.util.spec_from_file_location("scale_models", PEERS_DIR / "scale_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def add_shape(shapes: dict, name: str) -> None:
    """Register one of our shapes (qwen3-30b-a3b-<N>l) in the shared script's table."""
    if name in shapes:
        return
    m = re.fullmatch(r"qwen3-30b-a3b-(\d+)l", name)
    if not m:
        raise SystemExit(f"unknown model {name!r}: {sorted(shapes)} or qwen3-30b-a3b-<N>l")
    shapes[name] = {**QWEN3_30B_A3B, "num_hidden_layers": int(m.group(1))}


def llama_cpp_source(anchor: Path) -> Path:
    found = sorted(anchor.glob("src/llama_cpp_python-*/vendor/llama.cpp"))
    if not found:
        raise SystemExit(f"no llama.cpp source under {anchor}: run "
                         "ANCHOR_DIR=<dir> bash ../shared/peers/llamacpp-build.sh first")
    return found[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-cpp", type=Path, required=True,
                    help="the ANCHOR_DIR llamacpp-build.sh built in")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", nargs="+", default=["qwen3-30b-a3b-4l"])
    ap.add_argument("--types", nargs="+", default=["Q4_K_M"])
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="an HF folder with the tokenizer (default: the default model's)")
    args = ap.parse_args()
    if importlib.util.find_spec("sentencepiece") is None:  # (its Llama vocab tries it first)
        raise SystemExit("llama.cpp's convert_hf_to_gguf.py needs sentencepiece: "
                         "pip install sentencepiece")
    if args.tokenizer is None:
        from radixflow.runtime.model_loader import resolve_model

        args.tokenizer = Path(resolve_model(None))
    shared = shared_scale_models()
    src = llama_cpp_source(args.llama_cpp)
    quantize = args.llama_cpp / "build" / "bin" / "llama-quantize"
    if not quantize.is_file():
        subprocess.run(["cmake", "--build", str(args.llama_cpp / "build"), "--target",
                        "llama-quantize", "-j", str(os.cpu_count() or 2)], check=True)
    for name in args.models:
        add_shape(shared.SHAPES, name)
        folder = shared.make(name, args.out, args.tokenizer)
        bf16 = args.out / f"{name}-bf16.gguf"
        if not bf16.is_file():
            subprocess.run([sys.executable, str(PEERS_DIR / "convert_gguf.py"),
                            str(src / "convert_hf_to_gguf.py"), str(folder), "--outtype", "bf16",
                            "--outfile", str(bf16)], check=True)
        for kind in args.types:
            out = args.out / f"{name}-{kind}.gguf"
            if not out.is_file():
                subprocess.run([str(quantize), str(bf16), str(out), kind,
                                str(os.cpu_count() or 2)], check=True)
            print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
