"""One long prompt at the edge of the served context, on a model file, as a user would send it:
start-up time, the context the KV pool allows, the request's time and the peak resident
memory of every process (loading and serving). Issue #26's "an 8B Q4_K_M serves on a 24 GB
machine with a context of at least 8k tokens":

    python -m bench.long_context /tmp/scale/llama-8b-Q4_K_M.gguf

Prints a JSON summary; the prompt is the repo's docs, cut to the context less 600 tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import httpx

from .scale_serving import peak_rss, server_info

DOCS = Path(__file__).resolve().parent.parent / "docs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--margin", type=int, default=600, help="tokens left free in the context")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()

    from tokenizers import Tokenizer  # (not transformers': run from the repo root, its

    from radixflow.runtime.model_loader import resolve_model
    from radixflow.runtime.server.process import ServerProcess
    #   hub-kernels import finds the repo's kernels/ folder before the `kernels` package)

    text = "".join(p.read_text() for p in sorted(DOCS.glob("*.md")))
    started = time.perf_counter()
    with peak_rss() as rss, ServerProcess(args.model, port=30126, start_timeout=1800) as rt:
        healthy, load_peak = time.perf_counter() - started, rss["peak"]
        info = server_info(rt.url)["model_info"]
        folder = resolve_model(args.model, prepare=False)
        ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(
            text, add_special_tokens=False).ids
        prompt = ids[:info["context_length"] - args.margin]
        sent = time.perf_counter()
        reply = httpx.post(f"{rt.url}/generate", json={"input_ids": prompt, "sampling_params": {
            "max_new_tokens": args.max_new_tokens, "temperature": 0}}, timeout=3600)
        took = time.perf_counter() - sent
    meta = reply.json().get("meta_info", {}) if reply.status_code == 200 else {}
    print(json.dumps({
        "model": args.model, "healthy_s": round(healthy, 1),
        "context_length": info["context_length"], "kv_pool_tokens": info["max_total_tokens"],
        "status": reply.status_code, "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"), "request_s": round(took, 1),
        "load_peak_gb": round(load_peak / 1e9, 2), "peak_gb": round(rss["peak"] / 1e9, 2),
        "decode_step_weight_mb": round(info["cpu"]["decode_step_weight_bytes"] / 1e6)},
        indent=1))


if __name__ == "__main__":
    main()
