"""Variants of the int8 KV format, scored before building them: the default model (dense fp32
weights) teacher-forced over docs/*.md with its K and/or V passed through a variant's
quantize-dequantize on their way into an fp32 pool, against the same engine over a bf16 pool
(bench.quality --kv-cache-dtype's comparison).

    python -m bench.kv_int8_variants --chars 4000 --chunk 4
    python -m bench.kv_int8_variants --chars 18000 --chunk 64

Variants (any mix, per K and V): `rot` (the Hadamard rotation kernels/kv_int8.py applies to
keys), `center` (keys minus a per layer and KV head mean, calibrated on another text,
README.md: softmax gives every key of a query the same shift q . m, so attention is unchanged
by it), `first` (keys minus the calibration text's first key instead), `sink` (the first
token's key kept exact), `snap` (`center` with the mean moved by less than half a code step so
that the calibration text's first key, the attention sink, lands on the int8 grid: stored
exactly wherever a text starts with the same token, and no second storage form: what
kernels/kv_int8.py builds), `long` (`snap` around the keys' long-run mean instead: the
calibration keys turned back by their RoPE angles, averaged, and turned by the mean rotation
over positions 0 .. LONG_RUN - 1, so that channels which rotate within a long context are not
centred on where they stood in a short calibration), `qs` (with `qsnap`: keys stored as
(k - c) / s and read by queries q * s, s per KV head and RoPE channel pair = (K / Q)^(1/4), K
and Q the calibration's mean square centred key and query there, which minimises the score
error of uniform codes; the offset snapped in the scaled space). Prints one line per variant;
writes nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

ROOT = Path(__file__).parent.parent
VARIANTS = {  # name: (key steps, value steps); None: left exact
    "fp32 KV (the floor)": (None, None),
    "K rot": (("rot",), None),
    "V": (None, ()),
    "V rot": (None, ("rot",)),
    "K rot, V (the current format)": (("rot",), ()),
    "K rot, V rot": (("rot",), ("rot",)),
    "K center rot": (("center", "rot"), None),
    "K rot sink": (("rot", "sink"), None),
    "K center rot sink": (("center", "rot", "sink"), None),
    "K center rot, V": (("center", "rot"), ()),
    "K center rot, V rot": (("center", "rot"), ("rot",)),
    "K first rot": (("first", "rot"), None),
    "K first rot, V": (("first", "rot"), ()),
    "K snap rot": (("snap", "rot"), None),
    "K snap rot, V": (("snap", "rot"), ()),
    "K long rot, V": (("long", "rot"), ()),
    "K snap qs rot": (("qsnap", "qs", "rot"), None),
    "K snap qs rot, V": (("qsnap", "qs", "rot"), ()),
}
LONG_RUN = 4096  # positions the `long` mean averages the rotation over


def through_int8(x: torch.Tensor, steps: tuple[str, ...],
                 offsets: tuple[torch.Tensor, torch.Tensor] | None, first: bool) -> torch.Tensor:
    """x [tokens, kv_heads, head_dim] as a variant stores and reads it back; offsets: the
    layer's calibrated key mean and first key (what `center` / `first` subtract)."""
    from radixflow.kernels import kv_int8

    x = x.float()
    shift = {"center": offsets and offsets[0], "first": offsets and offsets[1],
             "snap": offsets and offsets[2], "long": offsets and offsets[3],
             "qsnap": offsets and offsets[5]}
    shift = next((shift[s] for s in steps if s in shift), 0)
    scale = offsets[4] if "qs" in steps else 1
    y = (x - shift) / scale
    if "rot" in steps:
        y = kv_int8.rotate(y)
    y = kv_int8.dequantize(*kv_int8.quantize(y), torch.float32)
    if "rot" in steps:
        y = kv_int8.rotate(y)  # (H H = I)
    y = y * scale + shift
    if "sink" in steps and first:
        y[0] = x[0]
    return y


def _snapped(mean: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """mean moved so that first - it quantizes exactly after rotation."""
    from radixflow.kernels import kv_int8

    rotated = kv_int8.rotate(first)
    grid = kv_int8.dequantize(*kv_int8.quantize(rotated - kv_int8.rotate(mean)), torch.float32)
    return kv_int8.rotate(rotated - grid)


def _turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] turned as RoPE turns it (rotate_half pairs), by angles cos/sin
    [..., head_dim / 2]."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)


def _long_run_mean(keys: torch.Tensor, theta: float) -> torch.Tensor:
    """The mean of post-RoPE keys over positions 0 .. LONG_RUN - 1, from the calibration keys
    (positions 0 ..): each turned back to position 0, averaged, turned by the mean rotation."""
    d = keys.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    back = torch.arange(keys.shape[0], dtype=torch.float64)[:, None] * freq
    still = _turned(keys, back.cos()[:, None].float(), -back.sin()[:, None].float())[1:].mean(0)
    ahead = torch.arange(LONG_RUN, dtype=torch.float64)[:, None] * freq
    return _turned(still, ahead.cos().mean(0).float(), ahead.sin().mean(0).float())


def _channel_scale(keys: torch.Tensor, mean: torch.Tensor, queries: torch.Tensor
                   ) -> torch.Tensor:
    """Per KV head and channel s [kv_heads, head_dim]: keys are stored as (k - c) / s, queries
    read them as q * s. The score error of uniform codes is ~ (sum s^2 Q)(sum K / s^2), Q and
    K a channel's mean square query and centred key; s = (K / Q)^(1/4) minimises it."""
    k2 = (keys[1:] - mean).pow(2).mean(0)
    q2 = queries.pow(2).mean((0, 2))
    half = k2.shape[-1] // 2  # RoPE turns channels i and i + half together: one scale a pair
    k2 = (k2[..., :half] + k2[..., half:]).repeat(1, 2)
    q2 = (q2[..., :half] + q2[..., half:]).repeat(1, 2)
    s = (k2 / q2.clamp_min(1e-12)).clamp_min(1e-12) ** 0.25
    return s / s.mean(-1, keepdim=True)


def _offsets(keys: torch.Tensor, theta: float, queries: torch.Tensor
             ) -> tuple[torch.Tensor, ...]:
    """A layer's calibration keys [tokens, kv_heads, head_dim] -> (their mean leaving the first
    out, the first, the mean snapped: first - snapped mean quantizes exactly after rotation,
    the long-run mean snapped, the channel scale, the mean snapped in the scaled space);
    queries [tokens, kv_heads, group, head_dim]: the same tokens' queries."""
    mean, first = keys[1:].mean(0), keys[0]
    scale = _channel_scale(keys, mean, queries)
    qsnap = _snapped(mean / scale, first / scale) * scale
    return (mean, first, _snapped(mean, first), _snapped(_long_run_mean(keys, theta), first),
            scale, qsnap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--chars", type=int, default=4000)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--exact-layers", nargs="*", type=int, default=[],
                    help="layers whose K/V stay exact (fp32) in every variant")
    args = ap.parse_args()

    from radixflow.runtime import memory_pool
    from radixflow.runtime.model_loader import resolve_model

    from .quality import score

    docs = ROOT / "docs"
    texts = [docs / "dsl.md"] + sorted(p for p in docs.glob("*.md") if p.name != "dsl.md")
    text = "\n\n".join(p.read_text() for p in texts)[:args.chars]
    dense = {"quantization": "none", "dtype": "float32"}
    write, keys, state = memory_pool.KVPool.write, {}, {"variant": None, "seen": set()}

    def patched(self, layer_id, slots, k, v):
        variant, state["layer"] = state["variant"], layer_id
        if variant == "calibrate":
            keys.setdefault(layer_id, []).append(k.detach().float().clone())
        elif variant is not None and layer_id not in args.exact_layers:
            k_steps, v_steps = VARIANTS[variant]
            first = layer_id not in state["seen"]
            state["seen"].add(layer_id)
            if k_steps is not None:
                k = through_int8(k, k_steps, offsets[layer_id], first)
            if v_steps is not None:
                v = through_int8(v, v_steps, None, first)
        return write(self, layer_id, slots, k, v)

    memory_pool.KVPool.write = patched
    rotate_queries, queries = memory_pool.KVPool.rotate_queries, {}

    def logged(self, q):
        if state["variant"] == "calibrate":
            queries.setdefault(state["layer"], []).append(q.detach().float().clone())
        return rotate_queries(self, q)

    memory_pool.KVPool.rotate_queries = logged
    state["variant"] = "calibrate"
    score((ROOT / "README.md").read_text()[:3000], 64, kv_cache_dtype="float32", **dense)
    theta = json.loads((resolve_model(None) / "config.json").read_text())
    theta = theta.get("rope_theta") or theta["rope_parameters"]["rope_theta"]
    if len(queries) != len(keys):
        raise SystemExit(f"queries seen in {len(queries)} layers of {len(keys)}")
    offsets = {}
    for layer, k in keys.items():
        k = torch.cat(k)
        q = torch.cat(queries[layer]).reshape(k.shape[0], k.shape[1], -1, k.shape[2])
        offsets[layer] = _offsets(k, theta, q)
    state["variant"] = None
    base, base_top, _, _ = score(text, args.chunk, kv_cache_dtype="bfloat16", **dense)
    print(f"{len(base_top)} tokens scored; each variant against the bf16 KV cache:")
    for name in args.variants:
        state["variant"], state["seen"] = name, set()
        logprobs, top, _, _ = score(text, args.chunk, kv_cache_dtype="float32", **dense)
        diff = (logprobs - base).abs()
        agree = sum(a == b for a, b in zip(top, base_top)) / len(top)
        print(f"| {name} | {diff.mean():.4f} | {diff.max():.3f} | {agree:.2%} |", flush=True)


if __name__ == "__main__":
    main()
