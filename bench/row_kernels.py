"""The row kernels (kernels/cpu/rows.c: residual add + RMSNorm, rope, SiLU * up in one pass
each) against the same work as torch ops: one extend forward of an N-token prompt on the default
model, the two alternating in one process (a drifting machine moves both), median of
`--repeats` pairs; each level in its own process with torch's kernels capped to it.

    python -m bench.row_kernels               # -> a section of bench/results/row-kernels.md
    python -m bench.row_kernels --levels avx2 --tokens 128 --repeats 4 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from .report import Run, publish

WAYS = ("row kernels", "torch ops")


def measure(level: str, tokens: list[int], repeats: int) -> dict[str, dict[int, float]]:
    """ms per forward of each prompt length, each way (runs in the capped child process)."""
    import torch

    from radixflow.kernels.cpu.rows import RowKernels
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

    out: dict[str, dict[int, float]] = {way: {} for way in WAYS}
    with Engine(None, cpu_isa=level, max_total_tokens=8192) as engine:
        runner = engine.scheduler.runner
        kernels = {"row kernels": RowKernels(), "torch ops": None}
        for n in tokens:
            ids = list(range(1000, 1000 + n))
            row, slots = runner.req_to_token_pool.alloc(), runner.kv_pool.alloc(n)
            runner.req_to_token_pool.req_to_token[row, :n] = slots.to(torch.int32)
            times: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(repeats + 1):  # the first pair warms up
                for way in WAYS:
                    runner.model.bind_row_kernels(kernels[way])
                    start = time.perf_counter()
                    runner.forward(ForwardMode.EXTEND, [BatchRequest(row, ids, 0, [n - 1])],
                                   slots)
                    times[way].append(time.perf_counter() - start)
            for way in WAYS:
                out[way][n] = statistics.median(times[way][1:]) * 1e3
            runner.kv_pool.free(slots)
            runner.req_to_token_pool.free(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", nargs="+", default=["avx512", "avx2"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 256, 512, 1024])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args.child, args.tokens, args.repeats)))
        return

    from radixflow.kernels.cpu.features import check_level

    from .peers import TORCH_CAPS

    date = datetime.date.today().isoformat()
    raw: dict[str, dict] = {}
    for level in args.levels:
        cpu = check_level(level).describe()
        proc = subprocess.run(
            [sys.executable, "-m", "bench.row_kernels", "--child", level,
             "--tokens", *map(str, args.tokens), "--repeats", str(args.repeats)],
            env={**os.environ, **TORCH_CAPS.get(level, {})}, capture_output=True, text=True,
            check=True)
        line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
        raw[level] = {"cpu": cpu, "ms": json.loads(line[7:])}
        print(level, raw[level]["ms"], flush=True)
    lines = [f"# Row kernels vs torch ops in an extend forward, {date}", "",
             f"Command: `python -m bench.row_kernels --levels {' '.join(args.levels)} "
             f"--tokens {' '.join(map(str, args.tokens))} --repeats {args.repeats}`", "",
             f"CPU: {raw[next(iter(raw))]['cpu']}. Default model, one forward of an N-token "
             "prompt with no prefix, ms, median of the pairs; each level with torch's kernels "
             "capped to it.", "",
             "| level | way | " + " | ".join(f"{n} tokens" for n in args.tokens) + " |",
             "|---|---|" + "---|" * len(args.tokens)]
    for level, run in raw.items():
        for way in WAYS:
            lines.append(f"| {level} | {way} | "
                         + " | ".join(f"{run['ms'][way][str(n)]:.1f}" for n in args.tokens) + " |")
        lines.append(f"| {level} | ratio | " + " | ".join(
            f"{run['ms']['row kernels'][str(n)] / run['ms']['torch ops'][str(n)]:.2f}"
            for n in args.tokens) + " |")
    publish("\n".join(lines) + "\n",
            None if args.no_write else Run("row-kernels", date), raw)


if __name__ == "__main__":
    main()
