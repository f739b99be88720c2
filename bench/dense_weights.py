"""What `--cpu-dense-weights` trades (runtime/models/quant_linear.py): a bf16 model's int4
layers multiply more than QUANT_MAX_ROWS rows with oneDNN's bf16 GEMM, either over a bf16 copy
of their weights kept beside the 4-bit tiles ("dense copy": 2 bytes a weight more) or over
blocks of output rows dequantized from the tiles at each call into one reused scratch buffer
("blocks", kernels/cpu's gemm_dequant), or the tiled int4 kernel ("tiled kernel", in passes of
8 rows). A layer without a copy runs the tiled kernel up to QuantLinear.blockwise_above rows
and blocks above (set from this bench's crossing).

One decoder layer of Llama-3.2-1B's shape (hidden 2048, intermediate 8192, 32 / 8 heads of
64: qkv 2048 -> 3072, o 2048 -> 2048, gate_up 2048 -> 16384, down 8192 -> 2048), random
Q4_1 weights, the products of an m-row prefill chunk; the ways alternate in one process (a
drifting machine moves them all), median of `--repeats` rounds.

    python -m bench.dense_weights                  # -> a section of bench/results/dense-weights.md
    python -m bench.dense_weights --rows 16 --repeats 3 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

from .report import Run, publish

# (name, in, out) of one Llama-3.2-1B layer's linears as radixflow holds them (fused qkv, gate_up)
LAYER = (("qkv", 2048, 3072), ("o", 2048, 2048), ("gate_up", 2048, 16384), ("down", 8192, 2048))
WAYS = ("dense copy", "blocks", "tiled kernel")
TILED_MAX_ROWS = 128  # above, the tiled kernel's passes of 8 rows (m / 8 of them) are skipped


def build(seed: int = 0):
    """Each linear as an Int4Linear with a bf16 copy and as one without (the same tiles)."""
    import torch
    from torch import nn

    from radixflow.runtime.models.quant_linear import Int4Linear, quantize_groups

    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _, k, n in LAYER:
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
        scale = (torch.rand(n, k // 32, generator=gen) * 0.002 + 1e-4).half().float()
        low = (-torch.rand(n, k // 32, generator=gen) * 0.01).half().float()
        linear = nn.Linear(k, n, bias=False)
        linear.weight.data = (low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1))
        groups = quantize_groups(linear.weight.detach())
        with_copy = Int4Linear(linear, groups=groups, dtype=torch.bfloat16, dense_copy=True)
        without = Int4Linear(linear, groups=groups, dtype=torch.bfloat16, dense_copy=False)
        assert with_copy.tiled is not None, "needs radixflow's CPU kernels (level avx512)"
        pairs.append((with_copy, without))
    return pairs


def memory(pairs) -> dict[str, int]:
    """Bytes per layer each way holds: the tiles, plus the copies or one block's scratch."""
    from radixflow.kernels import cpu

    tiles = sum(w.tiled.nbytes for _, w in pairs)
    copies = sum(c.dense_copy_bytes for c, _ in pairs)
    scratch = max(cpu.block_rows(w.in_features) * w.in_features * 2 for _, w in pairs)
    return {"tiles": tiles, "dense copy": tiles + copies, "blocks": tiles + scratch,
            "tiled kernel": tiles}


def measure(pairs, rows: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """ms for one layer's products of m rows, each way."""
    import torch

    from radixflow.kernels import cpu

    out: dict[str, dict[int, float]] = {way: {} for way in WAYS}
    for m in rows:
        xs = [torch.randn(m, c.in_features).bfloat16() for c, _ in pairs]
        ways = {
            "dense copy": lambda xs=xs: [c(x) for (c, _), x in zip(pairs, xs, strict=True)],
            "blocks": lambda xs=xs: [cpu.gemm_dequant(x, w.tiled, torch.bfloat16)
                                     for (_, w), x in zip(pairs, xs, strict=True)],
            "tiled kernel": lambda xs=xs: [cpu.gemm(x, w.tiled, torch.bfloat16)
                                           for (_, w), x in zip(pairs, xs, strict=True)],
        }
        if m > TILED_MAX_ROWS:
            del ways["tiled kernel"]
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats + 1):  # the first round warms up
            for way, run in ways.items():
                start = time.perf_counter()
                run()
                times[way].append(time.perf_counter() - start)
        for way in ways:
            out[way][m] = statistics.median(times[way][1:]) * 1e3
        print(m, {way: round(v[m], 2) for way, v in out.items() if m in v}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 128, 512])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    ap.add_argument("--note", default="", help="a sentence on the machine, for the report")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    import torch

    from radixflow.kernels import cpu
    from radixflow.kernels.cpu.features import cpu_features

    if args.threads:
        torch.set_num_threads(args.threads)
    if cpu.active_level() != "avx512" or not cpu_features().bf16:
        raise SystemExit("needs level avx512 (a bf16 model: the copies exist only there)")
    pairs = build()
    mem = memory(pairs)
    ms = measure(pairs, args.rows, args.repeats)
    date = datetime.date.today().isoformat()
    threads = torch.get_num_threads()
    mib = 2**20
    lines = [f"# Dense bf16 copies vs blocks dequantized from int4 tiles, {date}", "",
             f"Command: `python -m bench.dense_weights --rows {' '.join(map(str, args.rows))} "
             f"--repeats {args.repeats}{f' --threads {args.threads}' if args.threads else ''}`",
             "", f"CPU: {cpu_features().describe()}; {threads} torch threads. {args.note}".strip(),
             "", "One Llama-3.2-1B-shaped layer (qkv, o, gate_up, down; random Q4_1 weights), "
             "ms for its products of m rows, median of the rounds; memory the layer holds.", "",
             "| way | " + " | ".join(f"m = {m}" for m in args.rows) + " | MiB per layer |",
             "|---|" + "---|" * len(args.rows) + "---|"]
    for way in WAYS:
        cells = [f"{ms[way][m]:.2f}" if m in ms[way] else "-" for m in args.rows]
        lines.append(f"| {way} | " + " | ".join(cells) + f" | {mem[way] / mib:.0f} |")
    lines.append("| blocks / dense copy | " + " | ".join(
        f"{ms['blocks'][m] / ms['dense copy'][m]:.2f}" for m in args.rows) + " | "
        f"{mem['blocks'] / mem['dense copy']:.2f} |")
    publish("\n".join(lines) + "\n", None if args.no_write else Run("dense-weights", date),
            {"cpu": cpu_features().describe(), "threads": threads, "ms": ms, "bytes": mem})


if __name__ == "__main__":
    main()
