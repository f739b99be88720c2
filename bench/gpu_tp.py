"""Tensor parallelism on CUDA GPUs (NCCL): a check and a timing that fit in 5 minutes.

Written for a session lent a GPU machine; it has not been run on one yet (the machine these
benchmarks were written on has no GPU). On one GPU it runs --tp-size 1 only; with two or more
it also runs --tp-size 2:

1. correctness: fp32 greedy output of 8 prompts x 32 tokens, TP=2 against TP=1, on a random
   model of SmolLM2-135M's shape with 8 heads (9 do not split over 2); token-identical is
   expected, as on the CPU (NCCL's all-reduce sums in another order than one GEMM, so a
   near-tie may flip: the report says how many prompts agree);
2. timing, bf16 (the default on CUDA): start-up, a 500-token prefill, single-stream time per
   output token and 8-request batch throughput, for TP=1 and TP=2 on the 8-head model, and
   TP=1 on the default model when it is cached here (SmolLM2's 9 heads split over 3 GPUs
   only). The collectives' share is not reported: NCCL calls return before the GPU is done.

    python -m bench.gpu_tp                 # a section of bench/results/gpu-tp.md
    python -m bench.gpu_tp --tokens 32 --skip-correctness
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from pathlib import Path

from .report import Run, fmt, publish
from .tp import measure, random_model

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small",
           "The three primary colors are", "Water boils at", "Name a fruit that is yellow.",
           "1, 2, 3, 4, 5,", "A haiku about the sea:"]


def greedy(model: str, tp: int) -> list[list[int]]:
    from radixflow.runtime.engine import Engine

    with Engine(model, tp_size=tp, dtype="float32", max_total_tokens=4096) as engine:
        out = engine.generate(PROMPTS, {"max_new_tokens": 32, "temperature": 0,
                                        "ignore_eos": True})
    return [r["output_ids"] for r in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu_tp needs a CUDA GPU; for the CPU see bench.tp")
    gpus = torch.cuda.device_count()
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    started = time.monotonic()
    model8 = str(random_model(Path(os.environ.get("TMPDIR", "/tmp")) /
                              "radixflow-bench-8heads"))
    lines = [f"# Tensor parallelism on CUDA ({datetime.date.today().isoformat()})", "",
             f"GPUs: {gpus} x {names}; torch {torch.__version__}.", ""]
    raw: dict = {"gpus": gpus, "names": names}
    if gpus > 1 and not args.skip_correctness:
        one, two = greedy(model8, 1), greedy(model8, 2)
        same = sum(a == b for a, b in zip(one, two))
        raw["identical_prompts"] = same
        lines += [f"fp32 greedy, 8 prompts x 32 tokens, 8-head random model: TP=2 equals TP=1 "
                  f"on {same}/8 prompts.", ""]
    elif gpus == 1:
        lines += ["One GPU: TP=2 not run.", ""]
    bench_args = argparse.Namespace(dtype="auto", tokens=args.tokens, batch=args.batch,
                                    prompt_tokens=args.prompt_tokens, repeats=args.repeats,
                                    torch_ops=False)
    rows = [{"model": "8-head SmolLM2 shape", **measure(model8, 1, bench_args)}]
    if gpus > 1:
        rows.append({"model": "8-head SmolLM2 shape", **measure(model8, 2, bench_args)})
    try:
        from radixflow.runtime.model_loader import resolve_model

        rows.append({"model": "SmolLM2-135M", **measure(str(resolve_model(None)), 1,
                                                        bench_args)})
    except Exception as exc:  # not cached, and no network
        lines += [f"The default model is not available here ({type(exc).__name__}): its row "
                  "is missing.", ""]
    raw["rows"] = rows
    lines += [f"bf16, medians of {args.repeats}:", "",
              f"| model | TP | start-up s | prefill {args.prompt_tokens} tok s | TPOT ms | "
              f"batch {args.batch} tok/s |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['tp']} | {fmt(r['startup_s'])} | "
                     f"{fmt(r['prefill_s'])} | {fmt(r['tpot_ms'])} | {fmt(r['batch_tok_s'])} |")
    lines += ["", f"Whole run: {time.monotonic() - started:.0f} s."]
    out = args.out or Run("gpu-tp", datetime.date.today().isoformat())
    publish("\n".join(lines) + "\n", out, raw)


if __name__ == "__main__":
    main()
