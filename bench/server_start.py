"""How long `radixflow serve` takes to answer /health, and what its HTTP process holds.

Starts the server (default model unless --model) again and again, alternating two modes:
`auto`, with the tokenizer class record of the model folder removed first (the HTTP process
asks transformers' AutoTokenizer, which imports torch), and `recorded`, with the record left
from the start before (runtime/model_loader/tokenizer_class.py). Per start: seconds from the
launch to the first 200 from /health (ServerProcess polls every 0.25 s), the HTTP process's
resident memory then, and whether libtorch is mapped into it.

    python -m bench.server_start --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from radixflow.runtime.model_loader import resolve_model
from radixflow.runtime.model_loader.tokenizer_class import record_path
from radixflow.runtime.server.process import ServerProcess


def start_once(model: str | None) -> dict:
    t0 = time.monotonic()
    server = ServerProcess(model, log_level="warning")  # returns once /health answers 200
    try:
        ready_s = time.monotonic() - t0
        pid = server.proc.pid
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
        torch_mapped = "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    finally:
        server.shutdown()
    return {"ready_s": ready_s, "rss_mib": rss_kb / 1024, "torch": torch_mapped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    folder = resolve_model(args.model)
    record = record_path(Path(folder))
    runs: dict[str, list[dict]] = {"auto": [], "recorded": []}
    start_once(args.model)  # warms the page cache and writes the record
    for _ in range(args.rounds):
        for mode in ("recorded", "auto", "auto", "recorded"):
            if mode == "auto" and record is not None:
                record.unlink(missing_ok=True)
            runs[mode].append(start_once(args.model))
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
