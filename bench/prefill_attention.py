"""Prefill attention alone: radixflow's kernel (kernels/cpu/prefill.py) against torch's flash
attention for the CPU (what torch_native runs where the kernel is not built), on the default
model's heads (9 query heads, 3 KV heads, head_dim 64), in each level's model dtype (bf16 at
avx512, fp32 at avx2, torch's kernels capped to AVX2 there), over a bf16 KV pool: prompts of N
tokens alone (causal) and N tokens after a cached prefix; one layer, median of `--repeats`,
GFLOP/s of the causal work (2 x 2 x heads x head_dim per visible query-key pair) against this
CPU's measured peak for the level's instruction (bench.cpu_peak: vdpbf16ps, vfmadd231ps ymm).

    python -m bench.prefill_attention          # -> bench/results/prefill-attention.md
    python -m bench.prefill_attention --level avx2 --no-write --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from .report import Run, publish, run_key

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
CASES = [(128, 0), (512, 0), (1024, 0), (2048, 0), (30, 1000), (256, 1024)]  # (new, prefix)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_case(new: int, prefix: int, scale: float, repeats: int) -> tuple[float, float]:
    """ms of the kernel and of torch's flash attention for `new` tokens after `prefix`."""
    from radixflow.kernels.cpu import prefill

    g = torch.Generator().manual_seed(0)
    total, dtype = prefix + new, prefill.io_dtype()
    k = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g).bfloat16()
    v = torch.randn(total, KV_HEADS, HEAD_DIM, generator=g).bfloat16()
    q = torch.randn(new, HEADS, HEAD_DIM, generator=g).to(dtype)
    slots = torch.arange(total)
    ours = median_ms(lambda: prefill.prefill_attention(q, k, v, slots, prefix, scale), repeats)
    # torch attends over keys and values of the query dtype (torch_native converts the pool's)
    qt, kt, vt = (t.transpose(0, 1)[None].to(dtype) for t in (q, k, v))
    mask = None if prefix == 0 else \
        torch.arange(total)[None, :] <= prefix + torch.arange(new)[:, None]
    theirs = median_ms(lambda: F.scaled_dot_product_attention(
        qt, kt, vt, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True),
        repeats)
    return ours, theirs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--level", default="auto", choices=["auto", "avx512", "avx2"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.kernels.cpu import active_level, prefill
    from radixflow.kernels.cpu.features import check_level, cpu_features, set_level

    from .cpu_peak import peak_gops
    from .peers import TORCH_CAPS

    caps = TORCH_CAPS.get(args.level, {})
    if any(os.environ.get(k) != v for k, v in caps.items()):  # torch reads them at import
        os.execve(sys.executable, [sys.executable, "-m", "bench.prefill_attention",
                                   *sys.argv[1:]], {**os.environ, **caps})
    check_level(args.level)
    set_level(args.level)
    level = active_level()
    if level is None or not prefill.supported(HEADS, KV_HEADS, HEAD_DIM, prefill.io_dtype()):
        raise SystemExit("no prefill attention kernel here (needs the avx512 or avx2 build)")
    instruction = {"avx512": "vdpbf16ps zmm", "avx2": "vfmadd231ps ymm"}[level]
    peak = peak_gops(level)[instruction]
    scale = HEAD_DIM ** -0.5
    rows, raw = [], []
    for new, prefix in CASES:
        ours, theirs = time_case(new, prefix, scale, args.repeats)
        pairs = sum(prefix + i + 1 for i in range(new))
        gflop = 4 * HEADS * HEAD_DIM * pairs / 1e9
        raw.append({"new": new, "prefix": prefix, "kernel_ms": ours, "torch_ms": theirs,
                    "gflop": gflop})
        rows.append(f"| {new} | {prefix} | {ours:.2f} | {gflop / ours * 1e3:.0f} "
                    f"({gflop / ours * 1e3 / peak:.0%}) | {theirs:.2f} | {theirs / ours:.2f}x |")
    date = datetime.date.today().isoformat()
    dtype = str(prefill.io_dtype()).removeprefix("torch.")
    text = (f"# Prefill attention at {level}: radixflow's kernel vs torch's flash attention, "
            f"{date}\n\n"
            f"Command: `python -m bench.prefill_attention --level {args.level} --repeats "
            f"{args.repeats}`\n\n"
            f"CPU: {cpu_features().describe()}, {torch.get_num_threads()} threads; {instruction} "
            f"peak {peak:.0f} GFLOP/s (bench.cpu_peak, same run).\n\n"
            f"One layer of the default model's attention ({HEADS} query heads, {KV_HEADS} KV "
            f"heads, head_dim {HEAD_DIM}), {dtype} queries over a bf16 KV pool, median of "
            f"{args.repeats}; torch: "
            "F.scaled_dot_product_attention (causal alone, a boolean mask after a prefix).\n\n"
            "| new tokens | cached prefix | kernel (ms) | kernel GFLOP/s (of peak) | torch (ms) "
            "| speed-up |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")
    publish(text, None if args.no_write else Run("prefill-attention", run_key(date, level)),
            {"level": level, "peak_gflops": peak, "rows": raw})


if __name__ == "__main__":
    main()
