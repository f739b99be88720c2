"""Tiny random Hugging Face model folders for tests.

`make_tiny_model(dest, arch)` writes config.json, model.safetensors (float32, seeded random
weights) and a byte-level BPE tokenizer with a ChatML chat template, so a test can load the
folder with transformers (the correctness reference) and with radixflow's own loader.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

ARCHS = ("llama", "llama3_rope", "mistral", "qwen2", "qwen3", "smollm2")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOKENIZER_VOCAB_SIZE = 512

# SmolLM2-135M-Instruct's template, verbatim: ChatML with a default system turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model reads a short prompt and writes
an answer one token at a time. The cache keeps every prefix that two requests share, so the
second request starts where the first one stopped.
Once upon a time there was a little robot who lived in a library. Every morning it sorted the
books by colour, then by size, and then, when nobody was looking, by how much it liked them.
What is the capital of France? The capital of France is Paris. What is the capital of Italy?
The capital of Italy is Rome. Berlin is the capital of Germany, and Madrid is in Spain.
Please answer in JSON: {"name": "Alice", "age": 30, "city": "London", "tags": ["a", "b"]}
{"answer": true, "score": 0.75, "items": [1, 2, 3], "note": null, "nested": {"key": "value"}}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2025 3.14159 -7 +8 1e-5 99%
Punctuation: , . ; : ! ? ' " ( ) [ ] { } < > / \\ | - _ = + * & ^ % $ # @ ~ `
user: Hello! How are you today? assistant: I am fine, thank you. How can I help you?
system: You are a helpful assistant. Think step by step, then give the final answer.
Thought: I should search for the weather. Action: search("weather in Paris") Observation: sunny.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
"""


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """Train the byte-level BPE once per process; training is deterministic for a fixed corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return tok.to_str()


def make_tiny_tokenizer():
    """A fresh `PreTrainedTokenizerFast` (byte-level BPE, ChatML, eos <|im_end|>)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=EOS_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(arch: str = "llama", *, vocab_size: int, **overrides: Any):
    """The transformers config for `arch` at test size; `overrides` win over the defaults."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; expected one of {', '.join(ARCHS)}")
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        dtype="float32",
    )
    # Layer counts differ per arch so a hard-coded layer count cannot pass every test.
    if arch == "llama":
        cls, extra = LlamaConfig, dict(num_hidden_layers=2)
    elif arch == "llama3_rope":
        cls = LlamaConfig
        extra = dict(
            num_hidden_layers=2, rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE_SCALING)
        )
    elif arch == "smollm2":
        cls, extra = LlamaConfig, dict(num_hidden_layers=3, tie_word_embeddings=True)
    elif arch == "mistral":
        cls, extra = MistralConfig, dict(num_hidden_layers=3, sliding_window=None)
    elif arch == "qwen2":  # q/k/v projections carry a bias in Qwen2
        cls, extra = Qwen2Config, dict(num_hidden_layers=2, rope_theta=1000000.0)
    else:  # qwen3: per-head RMSNorm on q and k
        cls, extra = Qwen3Config, dict(num_hidden_layers=4, rope_theta=1000000.0)
    return cls(**{**common, **extra, **overrides})


def _randomize_(model, *, seed: int, std: float) -> None:
    """Seeded N(0, std) weights and biases; norm weights 1 + N(0, 0.1) so a skipped norm shows.

    HF's default init (std 0.02, norms exactly 1) makes a random model's greedy output one
    token repeated, which hides bugs; a larger std gives varied, input-dependent outputs.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(std * noise)


def make_tiny_model(
    dest: Path, arch: str = "llama", *, seed: int = 0, std: float = 0.15, tokenizer: Any = None,
    **config_overrides: Any
) -> Path:
    """Write a complete tiny HF model folder (config, float32 safetensors, tokenizer) to `dest`.

    `arch` is one of ARCHS; `config_overrides` are transformers config fields (e.g.
    ``num_hidden_layers=4``). `tokenizer`: a real one to use instead of the tiny BPE (e.g.
    test_assets.load_tokenizer("qwen3"), its chat template set); the vocab and bos/eos ids
    follow it. The same arch, seed and overrides always give the same files. Returns `dest`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    dest = Path(dest)
    if tokenizer is None:
        tokenizer = make_tiny_tokenizer()
    else:
        ends = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.eos_token_id}
        config_overrides = {**ends, **config_overrides}
    config = tiny_config(arch, vocab_size=len(tokenizer), **config_overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize_(model, seed=seed, std=std)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()

    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    _write_generation_config(dest, config)
    # (its tokenizer class recorded, as after a server's first start on it: the servers the
    # tests start on it skip AutoTokenizer's ~4 s of CPU)
    from radixflow.runtime.model_loader import load_tokenizer

    load_tokenizer(dest)
    return dest


def _write_generation_config(dest: Path, config) -> None:
    """Greedy-friendly generation defaults, as the instruct checkpoints ship them."""
    gen = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
    }
    (dest / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def write_tiny_gguf(hf_folder: Path, dest: Path, qtype_of=None) -> Path:
    """Write the llama-family model in `hf_folder` as an F32 GGUF file at `dest`, llama.cpp style.

    Mirrors what llama.cpp's convert_hf_to_gguf.py does for Llama: GGUF tensor names, q/k rows
    permuted for its rotary layout, `output.weight` left out when the head is tied, and a
    "gpt2" (byte-level BPE) tokenizer with the chat template in the metadata. Returns `dest`.
    `qtype_of(hf_name)`: a gguf.GGMLQuantizationType to store that tensor in (None: F32).
    """
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    hf_folder, dest = Path(hf_folder), Path(dest)
    config = json.loads((hf_folder / "config.json").read_text())
    if config["model_type"] != "llama":
        raise ValueError(f"write_tiny_gguf writes llama-family models, not {config['model_type']}")
    num_heads, num_kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    num_layers = config["num_hidden_layers"]
    rope_theta = config.get("rope_parameters", {}).get("rope_theta", config.get("rope_theta"))

    writer = gguf.GGUFWriter(str(dest), "llama")
    writer.add_name(hf_folder.name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(num_layers)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    _add_gguf_tokenizer(writer, hf_folder)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, num_layers)
    for hf_name, tensor in sorted(load_file(hf_folder / "model.safetensors").items()):
        if hf_name.endswith("q_proj.weight"):
            tensor = _llama_cpp_permute(tensor, num_heads)
        elif hf_name.endswith("k_proj.weight"):
            tensor = _llama_cpp_permute(tensor, num_kv_heads)
        qtype = qtype_of(hf_name) if qtype_of is not None else None
        data = np.ascontiguousarray(tensor)
        if qtype == gguf.GGMLQuantizationType.Q4_K:  # (the gguf package quantizes no K-quant)
            from helpers.gguf_test_blocks import quantize_q4_k

            data = quantize_q4_k(data.reshape(-1, data.shape[-1]))
        elif qtype == gguf.GGMLQuantizationType.Q5_K:
            from helpers.gguf_test_blocks import quantize_q4_k

            data = quantize_q4_k(data.reshape(-1, data.shape[-1]), bits=5)
        elif qtype == gguf.GGMLQuantizationType.Q6_K:
            from helpers.gguf_test_blocks import quantize_q6_k

            data = quantize_q6_k(data.reshape(-1, data.shape[-1]))
        elif qtype == gguf.GGMLQuantizationType.Q2_K:
            from helpers.gguf_test_blocks import quantize_q2_k

            data = quantize_q2_k(data.reshape(-1, data.shape[-1]))
        elif qtype == gguf.GGMLQuantizationType.Q3_K:
            from helpers.gguf_test_blocks import quantize_q3_k

            data = quantize_q3_k(data.reshape(-1, data.shape[-1]))
        elif qtype in (gguf.GGMLQuantizationType.IQ4_NL, gguf.GGMLQuantizationType.IQ4_XS):
            from helpers.gguf_test_blocks import quantize_iq4

            data = quantize_iq4(data.reshape(-1, data.shape[-1]),
                                xs=qtype == gguf.GGMLQuantizationType.IQ4_XS)
        elif qtype is not None:
            data = gguf.quants.quantize(data, qtype)
        writer.add_tensor(names.get_name(hf_name, try_suffixes=(".weight",)), data,
                          raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _llama_cpp_permute(weight, num_heads: int):
    """HF's rotate-half row order -> llama.cpp's interleaved pairs (what the converter undoes)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _add_gguf_tokenizer(writer, hf_folder: Path) -> None:
    import gguf

    tok = json.loads((hf_folder / "tokenizer.json").read_text())
    vocab = dict(tok["model"]["vocab"])
    special_ids = {added["id"] for added in tok["added_tokens"] if added["special"]}
    vocab.update({added["content"]: added["id"] for added in tok["added_tokens"]})
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    types = [
        gguf.TokenType.CONTROL if i in special_ids else gguf.TokenType.NORMAL
        for i in range(len(tokens))
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special = {t: vocab[t] for t in SPECIAL_TOKENS}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(special[BOS_TOKEN])
    writer.add_eos_token_id(special[EOS_TOKEN])
    writer.add_unk_token_id(special[UNK_TOKEN])
    writer.add_pad_token_id(special[EOS_TOKEN])
    writer.add_add_bos_token(False)
    writer.add_chat_template((hf_folder / "chat_template.jinja").read_text())
