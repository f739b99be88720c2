"""Kernel benchmark: each Triton kernel against its torch reference and the GPU's ceilings.

    python bench/kernels.py               # on a CUDA GPU; writes
                                          # bench/results/kernels-<gpu>-<date>.md
    python bench/kernels.py --smoke       # tiny shapes on the CPU under TRITON_INTERPRET=1,
                                          # checks the script itself; prints, writes nothing

bench/gpu_check.py runs the same measurements (`run_all`) as the first part of its report.

The ceilings are measured in the same run: copy bandwidth (a 2 GiB device-to-device copy,
read + write bytes) and the bf16 matmul rate (8192^3 torch.matmul). Every kernel is also
checked against its reference; the exit status is 1 if any disagrees.

Targets (issue: kernels): decode attention bs 64, ctx 4096, GQA 8:1 bf16 >= 70% of copy
bandwidth; extend attention on 4096-token prompts >= 40% of the bf16 matmul rate; bitmask
apply and sampling at bs 64 x vocab 128k < 50 us.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
VOCAB_128K = 128256  # Llama 3's vocab


@dataclass
class Row:
    kernel: str
    shape: str
    triton_us: float
    torch_us: float
    achieved: str = ""
    pct_of_ceiling: float | None = None
    target: str = ""
    met: bool | None = None
    check: str = ""
    correct: bool = True


@dataclass
class Setup:
    device: object  # torch.device
    smoke: bool

    def timer(self, fn: Callable[[], object]) -> float:
        """Median seconds per call."""
        if not self.smoke:
            import triton.testing

            return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") / 1e3
        fn()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def measure_ceilings(s: Setup) -> tuple[float, float]:
    """(copy bytes/s, matmul flop/s) on this device."""
    import torch

    nbytes = (64 << 20) if s.smoke else (2 << 30)
    src = torch.empty(nbytes, dtype=torch.uint8, device=s.device)
    dst = torch.empty_like(src)
    copy_bw = 2 * nbytes / s.timer(lambda: dst.copy_(src))
    n = 512 if s.smoke else 8192
    dtype = torch.float32 if s.smoke else torch.bfloat16
    a = torch.randn(n, n, dtype=dtype, device=s.device)
    b = torch.randn(n, n, dtype=dtype, device=s.device)
    matmul_rate = 2 * n**3 / s.timer(lambda: torch.matmul(a, b))
    return copy_bw, matmul_rate


def bench_decode(s: Setup, copy_bw: float, *, bs: int, ctx: int, num_heads: int,
                 num_kv_heads: int, head_dim: int, scattered: bool, target: float | None):
    import torch

    from radixflow.kernels.attention import decode_attention, decode_attention_torch

    dtype = torch.float32 if s.smoke else torch.bfloat16
    dev = s.device
    num_slots = bs * ctx
    k_cache = torch.randn(num_slots + 1, num_kv_heads, head_dim, dtype=dtype, device=dev)
    v_cache = torch.randn_like(k_cache)
    slots = (torch.randperm(num_slots, device=dev) if scattered
             else torch.arange(num_slots, device=dev)) + 1
    req_to_token = slots.view(bs, ctx).int()
    rows = torch.arange(bs, device=dev)
    seq_lens = torch.full((bs,), ctx, device=dev)
    q = torch.randn(bs, num_heads, head_dim, dtype=dtype, device=dev)
    scale = head_dim**-0.5
    args = (q, k_cache, v_cache, req_to_token, rows, seq_lens)

    def run(splits=None):
        return decode_attention(*args, scale=scale, num_kv_splits=splits, max_seq_len=ctx,
                                backend="triton")

    err = (run().float() - decode_attention_torch(*args, scale=scale).float()).abs().max()
    t = s.timer(run)
    sweep = {n: s.timer(lambda n=n: run(n)) for n in ((2,) if s.smoke else (2, 4, 8, 16, 32))}
    best = min(sweep, key=sweep.get)
    t_ref = s.timer(lambda: decode_attention_torch(*args, scale=scale))
    elt = k_cache.element_size()
    nbytes = 2 * bs * ctx * num_kv_heads * head_dim * elt + bs * ctx * 4 + 2 * q.nbytes
    pct = 100 * nbytes / t / copy_bw
    return Row(
        kernel="decode attention" + (" (scattered slots)" if scattered else ""),
        shape=f"bs {bs}, ctx {ctx}, heads {num_heads}:{num_kv_heads}, d {head_dim}",
        triton_us=t * 1e6, torch_us=t_ref * 1e6,
        achieved=f"{nbytes / t / 1e9:.0f} GB/s (best splits={best}: "
                 f"{nbytes / sweep[best] / 1e9:.0f} GB/s)",
        pct_of_ceiling=pct, target=f">= {target:.0f}% copy BW" if target else "",
        met=None if target is None else pct >= target,
        check=f"max err {err:.1e}", correct=bool(err <= 2e-2))


def bench_extend(s: Setup, matmul_rate: float, *, bs: int, prefix_len: int, extend_len: int,
                 num_heads: int, num_kv_heads: int, head_dim: int, target: float | None):
    import torch

    from radixflow.kernels.attention import extend_attention, extend_attention_torch

    dtype = torch.float32 if s.smoke else torch.bfloat16
    dev = s.device
    seq_len = prefix_len + extend_len
    num_slots = bs * seq_len
    k_cache = torch.randn(num_slots + 1, num_kv_heads, head_dim, dtype=dtype, device=dev)
    v_cache = torch.randn_like(k_cache)
    req_to_token = (torch.arange(num_slots, device=dev) + 1).view(bs, seq_len).int()
    new_slots = req_to_token[:, prefix_len:].reshape(-1).long()
    q = torch.randn(bs * extend_len, num_heads, head_dim, dtype=dtype, device=dev)
    k, v = k_cache[new_slots], v_cache[new_slots]
    lens = {"req_pool_indices": torch.arange(bs, device=dev),
            "prefix_lens": torch.full((bs,), prefix_len, device=dev),
            "extend_lens": torch.full((bs,), extend_len, device=dev),
            "extend_starts": torch.arange(bs, device=dev) * extend_len}
    scale = head_dim**-0.5

    def run():
        return extend_attention(q, k, v, k_cache, v_cache, req_to_token, **lens, scale=scale,
                                max_extend_len=extend_len, backend="triton")

    def ref():
        return extend_attention_torch(q, k, v, k_cache, v_cache, req_to_token, **lens,
                                      scale=scale)

    err = (run().float() - ref().float()).abs().max()
    t, t_ref = s.timer(run), s.timer(ref)
    flops = bs * num_heads * (4 * head_dim * extend_len * prefix_len
                              + 2 * head_dim * extend_len * (extend_len + 1))
    pct = 100 * flops / t / matmul_rate
    return Row(
        kernel="extend attention",
        shape=f"bs {bs}, prefix {prefix_len} + new {extend_len}, heads "
              f"{num_heads}:{num_kv_heads}, d {head_dim}",
        triton_us=t * 1e6, torch_us=t_ref * 1e6, achieved=f"{flops / t / 1e12:.0f} TFLOP/s",
        pct_of_ceiling=pct, target=f">= {target:.0f}% bf16 matmul" if target else "",
        met=None if target is None else pct >= target,
        check=f"max err {err:.1e}", correct=bool(err <= 2e-2))


def bench_bitmask(s: Setup, copy_bw: float, *, bs: int, vocab: int, constrained: str):
    import torch

    from radixflow.kernels.bitmask import apply_bitmask_, apply_bitmask_torch_

    dev = s.device
    logits = torch.randn(bs, vocab, device=dev)
    words = math.ceil(vocab / 32)
    bitmask = torch.randint(-2**31, 2**31 - 1, (bs, words), dtype=torch.int32, device=dev)
    rows = None if constrained == "all" else torch.arange(0, bs, 2, device=dev)
    want, got = logits.clone(), logits.clone()
    apply_bitmask_torch_(want, bitmask, rows)
    apply_bitmask_(got, bitmask, rows, backend="triton")
    t = s.timer(lambda: apply_bitmask_(got, bitmask, rows, backend="triton"))
    t_ref = s.timer(lambda: apply_bitmask_torch_(want, bitmask, rows))
    num_rows = bs if rows is None else rows.numel()
    nbytes = num_rows * (words * 4 + vocab * 4 // 2)  # random bits: half the logits written
    return _small_kernel_row("bitmask apply", f"bs {bs} x vocab {vocab}, {constrained} rows "
                             "constrained", t, t_ref, nbytes, copy_bw,
                             "exact" if torch.equal(got, want) else "MISMATCH",
                             torch.equal(got, want))


def bench_sampling(s: Setup, copy_bw: float, *, bs: int, vocab: int, mode: str):
    import torch

    from radixflow.kernels.sampling import sample_from_logits, sample_from_logits_torch

    dev = s.device
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(bs, vocab, device=dev, generator=g) * 4
    rows = torch.arange(bs, device=dev)
    if mode == "greedy":
        params = (torch.zeros(bs, device=dev), torch.full((bs,), -1, device=dev),
                  torch.ones(bs, device=dev), torch.zeros(bs, device=dev))
    elif mode == "temperature":
        params = (torch.full((bs,), 0.8, device=dev), torch.full((bs,), -1, device=dev),
                  torch.ones(bs, device=dev), torch.zeros(bs, device=dev))
    else:  # mixed per-row top-k / top-p / min-p
        params = (0.6 + 0.1 * (rows % 5), torch.where(rows % 3 == 0, 50, -1),
                  torch.where(rows % 2 == 0, 0.9, 1.0), torch.where(rows % 4 == 1, 0.05, 0.0))
    params = (params[0].float(), params[1].int(), params[2].float(), params[3].float())
    uniforms = torch.rand(bs, 32, device=dev, generator=g)
    got = sample_from_logits(logits, *params, uniforms, backend="triton")
    want = sample_from_logits_torch(logits, *params, uniforms)
    mismatches = int((got != want).sum())
    t = s.timer(lambda: sample_from_logits(logits, *params, uniforms, backend="triton"))
    t_ref = s.timer(lambda: sample_from_logits_torch(logits, *params, uniforms))
    return _small_kernel_row("sampling", f"bs {bs} x vocab {vocab}, {mode}", t, t_ref,
                             logits.nbytes, copy_bw, f"{mismatches} tokens differ",
                             mismatches <= max(1, bs // 32))  # CDF-boundary rounding only


def _small_kernel_row(kernel, shape, t, t_ref, nbytes, copy_bw, check, correct) -> Row:
    return Row(kernel=kernel, shape=shape, triton_us=t * 1e6, torch_us=t_ref * 1e6,
               achieved=f"{nbytes / t / 1e9:.0f} GB/s (one pass)",
               pct_of_ceiling=100 * nbytes / t / copy_bw, target="< 50 us",
               met=t * 1e6 < 50, check=check, correct=correct)


def render(rows: list[Row], header: list[str]) -> str:
    lines = header + ["", ("| kernel | shape | triton (us) | torch ref (us) | speedup | achieved "
                      "| % of ceiling | target | met | check |"),
                      "|---|---|---:|---:|---:|---|---:|---|---|---|"]
    for r in rows:
        pct = "" if r.pct_of_ceiling is None else f"{r.pct_of_ceiling:.0f}%"
        met = "" if r.met is None else ("yes" if r.met else "NO")
        lines.append(f"| {r.kernel} | {r.shape} | {r.triton_us:.1f} | {r.torch_us:.1f} | "
                     f"{r.torch_us / r.triton_us:.1f}x | {r.achieved} | {pct} | {r.target} | "
                     f"{met} | {r.check}{'' if r.correct else ' FAIL'} |")
    return "\n".join(lines) + "\n"


@dataclass
class KernelReport:
    rows: list[Row]
    device_name: str
    copy_bw: float  # bytes/s, read + write
    matmul_rate: float  # flop/s
    seconds: float
    smoke: bool

    @property
    def correct(self) -> bool:
        return all(r.correct for r in self.rows)

    def markdown(self, title: str) -> str:
        import torch
        import triton

        header = [
            title,
            "",
            (f"{datetime.datetime.now():%Y-%m-%d %H:%M}; torch {torch.__version__}, "
             f"triton {triton.__version__}; {'smoke sizes, ' if self.smoke else ''}"
             f"took {self.seconds:.0f} s."),
            "",
            (f"Ceilings measured in this run: copy bandwidth {self.copy_bw / 1e9:.0f} GB/s "
             f"(read + write), {'fp32' if self.smoke else 'bf16'} matmul "
             f"{self.matmul_rate / 1e12:.1f} TFLOP/s."),
            ("% of ceiling: decode and the small kernels against copy bandwidth (bytes that "
             "must move once), extend against the matmul rate (causal FLOPs)."),
        ]
        return render(self.rows, header)


def run_all(device, smoke: bool) -> KernelReport:
    """Every kernel row on `device` (smoke: tiny shapes, for the CPU's interpreter)."""
    import torch

    s = Setup(device, smoke)
    started = time.perf_counter()
    copy_bw, matmul_rate = measure_ceilings(s)
    if smoke:
        dec = {"bs": 2, "ctx": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64}
        ext = {"bs": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64}
        ext_shapes = [(0, 32), (16, 16)]
        bs, vocab = 4, 1000
    else:
        dec = {"bs": 64, "ctx": 4096, "num_heads": 32, "num_kv_heads": 4, "head_dim": 128}
        ext = {"bs": 4, "num_heads": 32, "num_kv_heads": 4, "head_dim": 128}
        ext_shapes = [(0, 4096), (2048, 2048)]
        bs, vocab = 64, VOCAB_128K
    rows = [
        bench_decode(s, copy_bw, **dec, scattered=False, target=70),
        bench_decode(s, copy_bw, **dec, scattered=True, target=None),
        bench_extend(s, matmul_rate, prefix_len=ext_shapes[0][0], extend_len=ext_shapes[0][1],
                     **ext, target=40),
        bench_extend(s, matmul_rate, prefix_len=ext_shapes[1][0], extend_len=ext_shapes[1][1],
                     **ext, target=None),
        bench_extend(s, matmul_rate, prefix_len=ext_shapes[0][0], extend_len=ext_shapes[0][1],
                     **{**ext, "head_dim": 64}, target=None),
        bench_bitmask(s, copy_bw, bs=bs, vocab=vocab, constrained="all"),
        bench_bitmask(s, copy_bw, bs=bs, vocab=vocab, constrained="half"),
        bench_sampling(s, copy_bw, bs=bs, vocab=vocab, mode="greedy"),
        bench_sampling(s, copy_bw, bs=bs, vocab=vocab, mode="temperature"),
        bench_sampling(s, copy_bw, bs=bs, vocab=vocab, mode="mixed"),
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    return KernelReport(rows, name, copy_bw, matmul_rate, time.perf_counter() - started, smoke)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU under the Triton interpreter")
    parser.add_argument("--out", type=Path, default=None, help="markdown file to write")
    args = parser.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    import torch

    if args.smoke:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("bench/kernels.py needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    report = run_all(device, args.smoke)
    table = report.markdown(f"# radixflow kernels on {report.device_name}")
    print(table)
    out = args.out
    if out is None and not args.smoke:
        slug = re.sub(r"[^a-z0-9]+", "-", report.device_name.lower().replace("nvidia", ""))
        out = RESULTS / f"kernels-{slug.strip('-')}-{datetime.date.today():%Y-%m-%d}.md"
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        print(f"wrote {out}")
    return 0 if report.correct else 1


if __name__ == "__main__":
    sys.exit(main())
