"""How long `radixflow serve` takes to answer /health, and what its HTTP process holds.

Starts the server (default model unless --model) again and again, alternating two modes:
`auto`, with the tokenizer class record of the model folder removed first (the HTTP process
asks transformers' AutoTokenizer, which imports torch), and `recorded`, with the record left
from the start before (runtime/model_loader/tokenizer_class.py). Per start: seconds from the
launch to the first 200 from /health, the HTTP process's resident memory then, and whether
libtorch is mapped into it.

    python -m bench.server_start --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from radixflow.runtime.ipc import free_port
from radixflow.runtime.model_loader import resolve_model
from radixflow.runtime.model_loader.tokenizer_class import record_path


def start_once(model: str | None, log: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "radixflow.runtime.cli", "serve", "--port", str(port),
           "--log-level", "warning", *(["--model", model] if model else [])]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.05)
        ready_s = time.monotonic() - t0
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
        torch_mapped = "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        proc.terminate()
        proc.wait(60)
    return {"ready_s": ready_s, "rss_mib": rss_kb / 1024, "torch": torch_mapped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    folder = resolve_model(args.model)
    record = record_path(Path(folder))
    runs: dict[str, list[dict]] = {"auto": [], "recorded": []}
    log = Path(tempfile.mkdtemp()) / "serve.log"
    start_once(args.model, log)  # warms the page cache and writes the record
    for _ in range(args.rounds):
        for mode in ("recorded", "auto", "auto", "recorded"):
            if mode == "auto" and record is not None:
                record.unlink(missing_ok=True)
            runs[mode].append(start_once(args.model, log))
            print(mode, runs[mode][-1], flush=True)
    print("\n| mode | starts | s to /health, median (min-max) | HTTP process RSS MiB "
          "| torch in it |")
    print("|---|---|---|---|---|")
    for mode, rs in runs.items():
        t = [r["ready_s"] for r in rs]
        print(f"| {mode} | {len(rs)} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) "
              f"| {statistics.median(r['rss_mib'] for r in rs):.0f} "
              f"| {sum(r['torch'] for r in rs)}/{len(rs)} |")


if __name__ == "__main__":
    main()
