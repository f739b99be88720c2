"""Overlapped scheduling: the idle gap between decode passes, with and without overlap.

For each batch size, the in-process Engine (default model) decodes a batch of requests with
fixed output lengths, once with the overlap scheduler (runtime/scheduler/decode.py) and once
with --disable-overlap-schedule, alternating `--rounds` times. Every forward pass is timed at
its start and end (wherever it runs), so the gap between one decode pass's end and the next
one's start is the time the model idles while the scheduler does its CPU work. Reports the
median pass, the median and p90 gap, the gap's share of the decode timeline, and tokens/s;
draws a timeline of a few passes of each mode (PNG).

    python -m bench.overlap                      # -> bench/results/overlap.md (+ a .png)
    python -m bench.overlap --batches 1 --rounds 1 --tokens 32 --no-write   # smoke run
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from pathlib import Path

from .report import Run, publish


def run_once(engine, batch: int, tokens: int) -> dict:
    runner = engine.scheduler.runner
    forward, log = runner.forward, []

    def timed(mode, parts, out_slots):
        start = time.perf_counter()
        try:
            return forward(mode, parts, out_slots)
        finally:
            log.append((mode.name, start, time.perf_counter()))

    prompts = [f"Story {i}: once upon a time, in a land far away," for i in range(batch)]
    params = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    engine.generate(prompts, params)  # warm: the prompts are cached from here on
    runner.forward = timed
    start = time.perf_counter()
    try:
        outs = engine.generate(prompts, params)
    finally:
        runner.forward = forward
    wall = time.perf_counter() - start
    decode = [(a, b) for mode, a, b in log if mode == "DECODE"]
    passes = [b - a for a, b in decode]
    gaps = [decode[i + 1][0] - decode[i][1] for i in range(len(decode) - 1)]
    return {"passes_ms": statistics.median(passes) * 1e3,
            "gap_ms": statistics.median(gaps) * 1e3,
            "gap_p90_ms": sorted(gaps)[int(0.9 * (len(gaps) - 1))] * 1e3,
            "gap_share": sum(gaps) / (decode[-1][1] - decode[0][0]),
            "tok_per_s": sum(o["meta_info"]["completion_tokens"] for o in outs) / wall,
            "timeline": [(a - decode[0][0], b - decode[0][0]) for a, b in decode[:12]]}


def plot(raw: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = raw["batches"]
    fig, axes = plt.subplots(len(batches), 1, figsize=(10, 1.6 * len(batches) + 0.6),
                             squeeze=False)
    for ax, batch in zip(axes[:, 0], batches):
        for row, mode in enumerate(("off", "on")):
            spans = raw["runs"][f"{batch}-{mode}"][0]["timeline"]
            ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in spans], (row - 0.35, 0.7),
                           color="tab:blue" if mode == "on" else "tab:gray")
        ax.set_yticks([0, 1], ["overlap off", "overlap on"])
        ax.set_title(f"batch {batch}: decode passes (bars) and the gaps between them",
                     fontsize=9)
    axes[-1, 0].set_xlabel("ms since the first decode pass")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine

    date = datetime.date.today().isoformat()
    raw = {"date": date, "batches": args.batches, "runs": {}}
    engines = {mode: Engine(None, max_total_tokens=100_000, cpu_isa=args.cpu_isa,
                            max_running_requests=max(args.batches),
                            disable_overlap_schedule=mode == "off") for mode in ("off", "on")}
    try:
        runner = engines["on"].scheduler.runner
        raw["cpu"] = runner.cpu.describe() if runner.device.type == "cpu" else "-"
        for _ in range(args.rounds):
            for batch in args.batches:
                for mode in ("off", "on"):
                    raw["runs"].setdefault(f"{batch}-{mode}", []).append(
                        run_once(engines[mode], batch, args.tokens))
    finally:
        for engine in engines.values():
            engine.shutdown()

    def med(batch: int, mode: str, key: str) -> float:
        return statistics.median(r[key] for r in raw["runs"][f"{batch}-{mode}"])

    lines = [f"# Overlapped scheduling: the gap between decode passes, {date}", "",
             f"Command: `python -m bench.overlap --batches {' '.join(map(str, args.batches))} "
             f"--tokens {args.tokens} --rounds {args.rounds} --cpu-isa {args.cpu_isa}`", "",
             f"CPU: {raw['cpu']}. Default model, in-process Engine, greedy, {args.tokens} tokens "
             f"per request; the two modes alternate, {args.rounds} rounds, medians over "
             "rounds.", "",
             "| batch | overlap | decode pass (ms) | gap p50 (ms) | gap p90 (ms) | gap share | "
             "tok/s |", "|---|---|---|---|---|---|---|"]
    for batch in args.batches:
        for mode in ("off", "on"):
            lines.append(f"| {batch} | {mode} | {med(batch, mode, 'passes_ms'):.2f} | "
                         f"{med(batch, mode, 'gap_ms'):.2f} | {med(batch, mode, 'gap_p90_ms'):.2f}"
                         f" | {med(batch, mode, 'gap_share') * 100:.1f}% | "
                         f"{med(batch, mode, 'tok_per_s'):.1f} |")
    out = None if args.no_write else Run("overlap", date)
    if out is not None:
        plot(raw, out.chart)
        lines += ["", f"![Timeline]({out.chart.name})"]
    for runs in raw["runs"].values():
        for r in runs[1:]:
            r.pop("timeline")
    publish("\n".join(lines) + "\n", out, raw)


if __name__ == "__main__":
    main()
