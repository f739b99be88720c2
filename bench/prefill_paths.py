"""Which matmul path computes a prefill fastest, per CPU level: one forward of an N-token prompt
(no prefix) on the default model through the model runner, median of `--repeats`, with
- "int4 kernels": radixflow's tiled Q4_1 kernels at every row count (kernels/cpu),
- "dense": the dense weights through torch (oneDNN/MKL): bf16 where the level has bf16
  arithmetic (AMX tiles where the CPU has them), else fp32,
- "default": what the server runs (quant_linear.py: int4 up to QUANT_MAX_ROWS rows, then the
  dense bf16 copy, at avx512; int4 throughout at avx2).
Each level runs in its own process with torch's kernels capped to it (bench/peers.py's caps).

    python -m bench.prefill_paths            # -> a section of bench/results/prefill-paths.md
    python -m bench.prefill_paths --levels avx2 --tokens 128 --repeats 1 --no-write
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


def measure(level: str, path: str, tokens: list[int], repeats: int) -> dict[int, float]:
    """ms per forward of each prompt length (runs in the capped child process)."""
    import torch

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
    from radixflow.runtime.models import quant_linear

    args = {"cpu_isa": level, "max_total_tokens": 8192}
    if path == "dense":
        args.update(quantization="none", dtype="bfloat16" if level == "avx512" else "float32")
    if path == "int4 kernels":
        quant_linear.QuantLinear.max_rows = 1 << 30
    out = {}
    with Engine(None, **args) as engine:
        runner = engine.scheduler.runner
        for n in tokens:
            ids = list(range(1000, 1000 + n))
            times = []
            for _ in range(repeats + 1):  # the first warms up
                slots = runner.kv_pool.alloc(n)
                runner.req_to_token_pool.req_to_token[1, :n] = slots.to(torch.int32)
                start = time.perf_counter()
                with torch.inference_mode():
                    runner.forward(ForwardMode.EXTEND, [BatchRequest(1, ids, 0, [n - 1])], slots)
                times.append(time.perf_counter() - start)
                runner.kv_pool.free(slots)
            out[n] = statistics.median(times[1:]) * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", nargs="+", default=["avx512", "avx2"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 512, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(*args.child, args.tokens, args.repeats)))
        return

    from radixflow.kernels.cpu.features import check_level

    from .peers import TORCH_CAPS

    date = datetime.date.today().isoformat()
    raw: dict[str, dict] = {}
    for level in args.levels:
        cpu = check_level(level).describe()
        for path in ("default", "int4 kernels", "dense"):
            env = {**os.environ, **TORCH_CAPS.get(level, {})}
            proc = subprocess.run(
                [sys.executable, "-m", "bench.prefill_paths", "--child", level, path,
                 "--tokens", *map(str, args.tokens), "--repeats", str(args.repeats)],
                env=env, capture_output=True, text=True, check=True)
            line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
            raw[f"{level}|{path}"] = {"cpu": cpu, "ms": json.loads(line[7:])}
            print(level, path, raw[f"{level}|{path}"]["ms"], flush=True)
    lines = [f"# Prefill: the fastest matmul path per CPU level, {date}", "",
             f"Command: `python -m bench.prefill_paths --levels {' '.join(args.levels)} "
             f"--tokens {' '.join(map(str, args.tokens))} --repeats {args.repeats}`", "",
             f"CPU: {raw[next(iter(raw))]['cpu']}. Default model, one forward of an N-token "
             "prompt with no prefix, ms, median; each level with torch's kernels capped to it.",
             "", "| level | path | " + " | ".join(f"{n} tokens" for n in args.tokens) + " |",
             "|---|---|" + "---|" * len(args.tokens)]
    for key, run in raw.items():
        level, path = key.split("|")
        lines.append(f"| {level} | {path} | "
                     + " | ".join(f"{run['ms'][str(n)]:.0f}" for n in args.tokens) + " |")
    publish("\n".join(lines) + "\n",
            None if args.no_write else Run("prefill-paths", date), raw)


if __name__ == "__main__":
    main()
