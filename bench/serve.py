"""Serving benchmark: radixflow vs the naive Hugging Face server, one server at a time.

For each server: start it, run each workload through the streaming OpenAI-compatible load
generator, stop it. Then a ratio table per workload (bench/compare.py) and the cache hit rate
radixflow's /metrics reports. (The HTTP + IPC overhead of one request is bench/overhead.py.)

    python -m bench.serve --workloads shared_prefix multi_turn --num-requests 64 --concurrency 64

Each run adds a section to bench/results/serve.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from . import workloads as wl
from .compare import write_comparison
from .loadgen import run_workload, write_run
from .report import RESULTS, Run, publish, raw_dir, run_key


def wait_healthy(url: str, timeout: float = 600.0, proc: subprocess.Popen | None = None,
                 log: Path | None = None) -> None:
    """Wait for GET /health to answer 200; fail early (with the end of `log`) if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-2000:] if log is not None else ""
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy in {timeout:.0f} s")


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus counter/gauge's samples."""
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


def run_server_workloads(name: str, url: str, args, num_sessions: int) -> dict[str, dict]:
    runs = {}
    for workload_name in args.workloads:
        workload = wl.build(workload_name, num_sessions=num_sessions,
                            concurrency=args.concurrency, seed=args.seed)
        print(f"{name}: {workload_name}, {workload.num_requests} requests ...", flush=True)
        runs[workload_name] = asyncio.run(run_workload(url, workload))
        write_run(runs[workload_name], name, args.out_dir)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["shared_prefix", "multi_turn"])
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline-requests", type=int, default=16,
                    help="sessions the one-at-a-time HF server runs "
                         "(its rates do not depend on it)")
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="each server's report, the raw JSON and the charts (default: "
                         "bench/results/raw/serve/, out of git)")
    ap.add_argument("--tag", default="", help="what sets this run apart: its section's key in "
                                              "bench/results/serve.md is <date>-<tag>")
    args = ap.parse_args()
    date = datetime.date.today().isoformat()
    run = Run("serve", run_key(date, args.tag))
    args.out_dir = args.out_dir or raw_dir("serve")

    from radixflow.runtime.server.process import ServerProcess

    results: dict[str, dict[str, dict]] = {}
    with ServerProcess(None, port=30123) as rt:
        results["radixflow"] = run_server_workloads("radixflow", rt.url, args, args.num_requests)
        metrics = httpx.get(f"{rt.url}/metrics").text
        info = httpx.get(f"{rt.url}/get_model_info").json()
    weights = f"{info['dtype']}{' with int4 weights' if info['quantization'] == 'int4' else ''}"
    hit = metric(metrics, "radixflow:cached_prompt_tokens_total")
    prompt = metric(metrics, "radixflow:prompt_tokens_total")

    if not args.no_baseline:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hf_baseline_server", "--port", "18070"],
            env=env, cwd=Path(__file__).parent.parent)
        try:
            wait_healthy("http://127.0.0.1:18070", proc=proc)
            results["hf-naive"] = run_server_workloads("hf-naive", "http://127.0.0.1:18070", args,
                                                      args.baseline_requests)
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    lines = [f"# Serving benchmark, {date}", "",
             f"Command: `python -m bench.serve --workloads {' '.join(args.workloads)} "
             f"--num-requests {args.num_requests} --concurrency {args.concurrency} "
             f"--baseline-requests {args.baseline_requests}"
             f"{' --no-baseline' if args.no_baseline else ''}"
             f"{' --tag ' + args.tag if args.tag else ''}`", "",
             f"radixflow serves {args.num_requests} sessions at concurrency {args.concurrency}; "
             f"the naive HF server (one request at a time) the first {args.baseline_requests} of "
             "the same seeded sessions.", "",
             f"Default model (SmolLM2-135M-Instruct, {weights}), 2-core CPU, streaming chat "
             "completions, greedy, fixed output lengths (ignore_eos). One server running at a "
             f"time. Each server's own report, the raw JSON and a chart per workload: "
             f"`{os.path.relpath(args.out_dir, RESULTS)}/` (not in git).", ""]
    for workload_name in args.workloads:
        runs = {name: res[workload_name] for name, res in results.items()}
        table, _ = write_comparison(runs, args.out_dir)
        lines += [table, ""]
    lines += ["## radixflow cache", "",
              f"- Cache hit rate over the whole run (/metrics): {hit / max(prompt, 1):.1%} "
              f"({hit:.0f} of {prompt:.0f} prompt tokens).", ""]
    publish("\n".join(lines), run)


if __name__ == "__main__":
    main()
