"""The bytes one decode step of a GGUF model reads, as llama.cpp reads the file: every tensor in
its own format, once per step, except the token embedding (one row per token, unless it is
the head too: tied, with no `output.weight`) and a
mixture-of-experts layer's stacked experts (`*_exps`: only the `expert_used_count` experts a
token is routed to), plus the K/V of the context. Against the machine's copy bandwidth
(bench/decode_step.py's), that bounds a single stream's time per token.

    python -m bench.gguf_bytes /tmp/scale/qwen3-30b-a3b-2l-Q4_K_M.gguf --context 193

Prints the bytes by part and the bound; `bytes_per_token(path)` is the same for other benches.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StepBytes:
    parts: dict[str, int] = field(default_factory=dict)  # part -> bytes a step reads
    held: int = 0  # every tensor's bytes (the file less its metadata)
    kv_per_token: int = 0  # bytes of K and V one context token adds (fp16 cache)

    def total(self, context: int = 0) -> int:
        return sum(self.parts.values()) + self.kv_per_token * context


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def bytes_per_token(path: Path) -> StepBytes:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = _field(reader, "general.architecture")
    used, experts = _field(reader, f"{arch}.expert_used_count"), _field(reader,
                                                                        f"{arch}.expert_count")
    out = StepBytes()
    tied = not any(t.name.startswith("output.") for t in reader.tensors)
    for t in reader.tensors:
        size = int(t.n_bytes)
        out.held += size
        name = t.name
        if name.startswith("token_embd") and tied:  # the head too: read whole every step
            part = "head (the embedding, tied)"
        elif name.startswith("token_embd"):
            part, size = "embedding row", size // int(t.shape[-1])  # (shape: [hidden, vocab])
        elif "_exps" in name:
            part, size = "routed experts", size * int(used) // int(experts)
        elif name.startswith("output."):
            part = "head"
        elif ".attn_" in name:
            part = "attention"
        elif "ffn_gate_inp" in name or "_shexp" in name:
            part = "router + shared expert"
        elif ".ffn_" in name:
            part = "mlp"
        else:
            part = "norms and other"
        out.parts[part] = out.parts.get(part, 0) + size
    layers = int(_field(reader, f"{arch}.block_count"))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv"))
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", hidden // heads))
    out.kv_per_token = layers * 2 * kv_heads * head_dim * 2
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--context", type=int, default=0, help="tokens of K/V a step reads")
    ap.add_argument("--no-bandwidth", action="store_true", help="skip the copy measurement")
    args = ap.parse_args()
    got = bytes_per_token(args.gguf)
    for part, size in sorted(got.parts.items(), key=lambda kv: -kv[1]):
        print(f"{part:24s} {size / 1e6:10.1f} MB")
    kv = got.kv_per_token * args.context
    print(f"{'K/V (' + str(args.context) + ' tokens)':24s} {kv / 1e6:10.1f} MB")
    total = got.total(args.context)
    print(f"{'a step reads':24s} {total / 1e6:10.1f} MB (of {got.held / 1e6:.1f} MB held)")
    if not args.no_bandwidth:
        from .decode_step import copy_bandwidth

        bandwidth = copy_bandwidth()
        print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s: a step takes at least "
              f"{total / bandwidth * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
