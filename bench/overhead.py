"""HTTP + IPC overhead: a 1-token request through `radixflow serve` vs on the in-process Engine.

Both run the same model in one benchmark process's lifetime: the server as a subprocess, the
Engine in this process. They take turns in blocks (server block, Engine block, ...), never at
the same time, so the machine's drift over minutes hits both sides alike; one block's warm-up
requests are dropped so the other side's worker threads have gone to sleep. The request body
is the same native /generate body on both sides (the Engine parses and tokenizes it too).

    python -m bench.overhead                 # a section of bench/results/overhead.md
    python -m bench.overhead --blocks 4 --per-block 8 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import httpx

from .report import Run, publish

WARMUP_PER_BLOCK = 2


def body(i: int) -> dict:
    return {"text": f"Say {i}", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def measure(sides: dict, blocks: int, per_block: int) -> dict[str, list[list[float]]]:
    """{side: [[seconds of each request] per block]}, blocks alternating between sides."""
    times: dict[str, list[list[float]]] = {name: [] for name in sides}
    i = 0
    for _ in range(blocks):
        for name, call in sides.items():
            block = []
            for k in range(WARMUP_PER_BLOCK + per_block):
                i += 1
                start = time.perf_counter()
                call(body(i))
                if k >= WARMUP_PER_BLOCK:
                    block.append(time.perf_counter() - start)
            times[name].append(block)
    return times


def summarize(times: dict[str, list[list[float]]], reference: str) -> list[str]:
    ref = [t for block in times[reference] for t in block]
    ref_p50 = statistics.median(ref)
    lines = ["| path | p50 (ms) | p90 (ms) | added at p50 (ms) | added, median over blocks (ms) |",
             "|---|---|---|---|---|"]
    for name, blocks in times.items():
        flat = [t for block in blocks for t in block]
        per_block = [statistics.median(b) - statistics.median(r)
                     for b, r in zip(blocks, times[reference])]
        added = "-" if name == reference else f"{(statistics.median(flat) - ref_p50) * 1e3:+.1f}"
        added_blocks = "-" if name == reference else f"{statistics.median(per_block) * 1e3:+.1f}"
        lines.append(f"| {name} | {statistics.median(flat) * 1e3:.1f} | "
                     f"{percentile(flat, 90) * 1e3:.1f} | {added} | {added_blocks} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--per-block", type=int, default=10)
    ap.add_argument("--quantization", default="auto", choices=["auto", "none", "int4"])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.server.process import ServerProcess

    with (ServerProcess(None, quantization=args.quantization) as rt,
          Engine(None, quantization=args.quantization) as engine,
          httpx.Client(timeout=60) as client):
        model = client.get(f"{rt.url}/v1/models").json()["data"][0]["id"]
        sides = {
            "Engine (in-process)": engine.generate_from_body,
            "server /generate":
                lambda b: client.post(f"{rt.url}/generate", json=b).raise_for_status(),
            "server /v1/completions": lambda b: client.post(f"{rt.url}/v1/completions", json={
                "model": model, "prompt": b["text"], "max_tokens": 1, "temperature": 0,
            }).raise_for_status(),
        }
        times = measure(sides, args.blocks, args.per_block)

    date = datetime.date.today().isoformat()
    command = (f"python -m bench.overhead --blocks {args.blocks} --per-block {args.per_block}"
               f" --quantization {args.quantization}")
    lines = [f"# HTTP + IPC overhead of a 1-token request, {date}", "", f"Command: `{command}`", "",
             f"Default model, quantization {args.quantization}, 2-core CPU. {args.blocks} blocks "
             f"of {args.per_block} requests per path (after {WARMUP_PER_BLOCK} warm-up requests "
             "each), the paths taking turns block by block; one request at a time. "
             "`added` is the path's latency minus the in-process Engine's.", "",
             *summarize(times, "Engine (in-process)"), ""]
    publish("\n".join(lines), None if args.no_write else Run("overhead", date))


if __name__ == "__main__":
    main()
