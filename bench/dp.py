"""Data parallelism: `radixflow serve --dp-size 2`, cache_aware vs round_robin routing.

For each --load-balance-method, one server with two replicas (one at a time), each workload
through the streaming OpenAI load generator with the cache flushed before it; the replicas'
cache hit rates and request split come from /get_server_info (before/after deltas).

Workloads, with several distinct system prompts:
- shared_prefix: --groups groups of sessions, each group with its own long system prompt
  (bench/workloads.py's shared_prefix, a seed per group), interleaved so that consecutive
  requests change prefix.
- multi_turn: bench/workloads.py's, where every conversation has its own system prompt and
  each turn re-sends the history.

    python -m bench.dp --workloads shared_prefix multi_turn --sessions 16 --concurrency 8

Each run adds a section to bench/results/dp-router.md; each method's own reports and raw JSON go
under bench/results/raw/dp-router/ (out of git).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from pathlib import Path

import httpx

from . import workloads as wl
from .loadgen import run_workload, write_run
from .report import Run, fmt, publish, raw_dir


def grouped_shared_prefix(num: int, groups: int, seed: int, scale: float) -> list[wl.Session]:
    per_group = [wl.shared_prefix(-(-num // groups), seed + g, scale) for g in range(groups)]
    interleaved = [s for row in zip(*per_group, strict=True) for s in row]
    return interleaved[:num]


def build(name: str, args: argparse.Namespace) -> wl.Workload:
    if name == "shared_prefix":
        sessions = grouped_shared_prefix(args.sessions, args.groups, args.seed, args.scale)
        return wl.Workload(name=name, sessions=sessions, concurrency=args.concurrency,
                           meta={"seed": args.seed, "scale": args.scale,
                                 "groups": args.groups})
    if name == "multi_turn":
        sessions = wl.multi_turn(args.sessions, args.seed, args.scale, turns=args.turns)
        return wl.Workload(name=name, sessions=sessions, concurrency=args.concurrency,
                           meta={"seed": args.seed, "scale": args.scale, "turns": args.turns})
    raise ValueError(f"unknown workload {name!r}")


def replicas(url: str) -> list[dict]:
    return httpx.get(url + "/get_server_info", timeout=30).json()["replicas"]


def deltas(before: list[dict], after: list[dict]) -> list[dict]:
    out = []
    for b, a in zip(before, after, strict=True):
        d = {k: a.get(k, 0) - b.get(k, 0)
             for k in ("routed_requests", "cache_routed_requests", "prompt_tokens",
                       "cache_hit_tokens", "generation_tokens")}
        d["hit_rate"] = d["cache_hit_tokens"] / d["prompt_tokens"] if d["prompt_tokens"] else 0.0
        out.append(d)
    return out


def wait_stats(url: str, since: float) -> None:
    """Until every replica has reported stats after `since` (they come every 0.5 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        info = httpx.get(url + "/get_server_info", timeout=30).json()
        if info.get("stats_time", 0) > since + 1.0 and info["num_pending_requests"] == 0:
            return
        time.sleep(0.3)


def run_method(method: str, args: argparse.Namespace) -> dict[str, dict]:
    from radixflow.runtime.server.process import ServerProcess

    out: dict[str, dict] = {}
    with ServerProcess(args.model, dp_size=args.dp_size, load_balance_method=method,
                       log_level="warning") as rt:
        for name in args.workloads:
            workload = build(name, args)
            httpx.post(rt.url + "/flush_cache", timeout=60).raise_for_status()
            before = replicas(rt.url)
            print(f"{method}: {name}, {workload.num_requests} requests ...", flush=True)
            run = asyncio.run(run_workload(rt.url, workload, warmup=0))
            wait_stats(rt.url, time.time())
            run["replicas"] = deltas(before, replicas(rt.url))
            write_run(run, f"dp{args.dp_size}-{method}", args.out_dir)
            out[name] = run
    return out


def cpu_line() -> str:
    from radixflow.kernels.cpu.features import detect

    cpu = detect()
    flags = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16",
                                 "avx512_vnni", "amx_tile") if f in cpu.flags)
    return (f"{cpu.model or cpu.arch}, CPU level {cpu.level} (/proc/cpuinfo flags: {flags}), "
            f"{os.cpu_count()} cores")


def report(results: dict[str, dict[str, dict]], args: argparse.Namespace, load: str) -> str:
    date = datetime.date.today().isoformat()
    lines = [f"# Data parallelism: cache_aware vs round_robin, {date}", "",
             f"Command: `python -m bench.dp {' '.join(sys.argv[1:])}`", "",
             f"Machine: {cpu_line()}. Load average (1/5/15 min) before and after: {load}. "
             "Other processes (other engineers' tests and builds) ran on this 2-core machine "
             "during the run, so absolute rates are noisy; the two methods ran one after "
             "the other on the same machine.", "",
             f"Server: `radixflow serve --dp-size {args.dp_size} --load-balance-method M` "
             f"({args.model or 'the default SmolLM2-135M-Instruct'}), each replica with "
             f"{max(1, (os.cpu_count() or 1) // args.dp_size)} torch thread(s). Streaming chat "
             "completions, greedy, fixed output lengths; the cache flushed before each "
             f"workload. {args.sessions} sessions at concurrency {args.concurrency}, scale "
             f"{args.scale}.", ""]
    for name in args.workloads:
        lines += [f"## {name}", ""]
        if name == "shared_prefix":
            lines += [f"{args.groups} system prompts (one per group of sessions), requests "
                      "interleaved across groups.", ""]
        else:
            lines += [f"Each conversation has its own system prompt; {args.turns} turns, each "
                      "re-sending the history.", ""]
        lines += ["| method | output tok/s | req/s | TTFT p50 (ms) | TTFT p90 (ms) | "
                  "e2e p50 (s) | cache hit rate | requests per replica | hit rate per replica "
                  "| errors |", "|---|---|---|---|---|---|---|---|---|---|"]
        for method, runs in results.items():
            run = runs[name]
            s, reps = run["summary"], run["replicas"]
            prompt = sum(r["prompt_tokens"] for r in reps)
            hit = sum(r["cache_hit_tokens"] for r in reps)
            lines.append(
                f"| {method} | {fmt(s['output_tok_s'])} | {fmt(s['req_s'])} | "
                f"{fmt(s['ttft_ms_p50'])} | {fmt(s['ttft_ms_p90'])} | {fmt(s['e2e_s_p50'])} | "
                f"{hit / max(prompt, 1):.1%} | "
                f"{' / '.join(str(r['routed_requests']) for r in reps)} | "
                f"{' / '.join(format(r['hit_rate'], '.1%') for r in reps)} | {s['errors']} |")
        lines.append("")
    lines += ["Cache hit rate: prompt tokens served from the replicas' radix caches / prompt "
              "tokens, from the replicas' own stats over the workload (the warm-up-free run, "
              "cache flushed first).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["shared_prefix", "multi_turn"],
                    choices=["shared_prefix", "multi_turn"])
    ap.add_argument("--methods", nargs="+", default=["cache_aware", "round_robin"],
                    choices=["cache_aware", "round_robin", "shortest_queue"])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--dp-size", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--groups", type=int, default=3,
                    help="shared_prefix: system prompts (not a multiple of --dp-size, or round "
                         "robin sends each group to one replica by accident)")
    ap.add_argument("--turns", type=int, default=3, help="multi_turn: turns per conversation")
    ap.add_argument("--scale", type=float, default=0.5, help="prompt size factor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=raw_dir("dp-router"),
                    help="each method's own reports and raw JSON")
    ap.add_argument("--output", type=Path, default=None,
                    help="a markdown file for the summary (default: its section of "
                         "bench/results/dp-router.md)")
    args = ap.parse_args()

    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    results = {method: run_method(method, args) for method in args.methods}
    load_after = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    text = report(results, args, f"{load_before} / {load_after}")
    publish(text, args.output or Run("dp-router", datetime.date.today().isoformat()))


if __name__ == "__main__":
    main()
