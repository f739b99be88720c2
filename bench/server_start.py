"""How long `radixflow serve` takes to answer /health, the CPU its processes spent getting
there, and what its HTTP process holds.

Starts the server (default model unless --model) again and again, alternating two modes,
(a, b, b, a) per round:
- default: `recorded` vs `auto`: `auto` removes the model folder's tokenizer class record
  first (runtime/model_loader/tokenizer_class.py: a folder's first start), `recorded` leaves
  the one the start before wrote;
- `--against DIR`: this checkout vs a radixflow installed into DIR
  (`pip install --no-deps --target DIR <a checkout of another commit>`), put first on the
  servers' PYTHONPATH; both `recorded`.
Per start: seconds from the launch to the first 200 from /health (ServerProcess polls every
0.25 s), the CPU seconds of the server and its children until then (/proc: user + system),
the HTTP process's resident memory, and whether libtorch is mapped into it.

    python -m bench.server_start --rounds 4
    python -m bench.server_start --model /tmp/tiny --against /tmp/rf-before --rounds 5
    python -m bench.server_start --tp-size 3 --against /tmp/rf-before --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from radixflow.runtime.model_loader import resolve_model
from radixflow.runtime.model_loader.tokenizer_class import record_path
from radixflow.runtime.server.process import ServerProcess

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """pid and every live process below it (each process's parent from /proc/N/stat)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += [c for c, pp in parent.items() if pp == p]
    return found


def _cpu_s(pid: int) -> float:
    """User + system seconds of the process and its waited-for children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / CLOCK_TICKS


@contextlib.contextmanager
def _pythonpath(first: str | None) -> Iterator[None]:
    old = os.environ.get("PYTHONPATH")
    if first is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (first, old) if p)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def start_once(model: str | None, pythonpath: str | None = None, tp_size: int = 1) -> dict:
    t0 = time.monotonic()
    with _pythonpath(pythonpath):
        # (returns once /health answers 200)
        server = ServerProcess(model, log_level="warning", tp_size=tp_size)
    try:
        ready_s = time.monotonic() - t0
        pid = server.proc.pid
        cpu_s = sum(_cpu_s(p) for p in _tree(pid))
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
        torch_mapped = "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    finally:
        server.shutdown()
    return {"ready_s": round(ready_s, 2), "cpu_s": round(cpu_s, 2), "rss_mib": rss_kb / 1024,
            "torch": torch_mapped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tp-size", type=int, default=1, help="the servers' --tp-size")
    ap.add_argument("--against", default=None, metavar="DIR",
                    help="a radixflow installed with pip install --target DIR: this checkout "
                         "vs that one, instead of recorded vs auto")
    args = ap.parse_args()
    folder = resolve_model(args.model)
    record = record_path(Path(folder))
    if args.against:
        modes = {"this checkout": None, f"--against {args.against}": args.against}
    else:
        modes = {"recorded": None, "auto": None}
    a, b = modes
    runs: dict[str, list[dict]] = {a: [], b: []}
    for path in set(modes.values()):  # warms the page cache, builds the kernels, records
        start_once(args.model, path, args.tp_size)
    for _ in range(args.rounds):
        for mode in (a, b, b, a):
            if mode == "auto" and record is not None:
                record.unlink(missing_ok=True)
            runs[mode].append(start_once(args.model, modes[mode], args.tp_size))
            print(mode, runs[mode][-1], flush=True)
    print("\n| mode | starts | s to /health, median (min-max) | CPU s, median | HTTP process "
          "RSS MiB | torch in it |")
    print("|---|---|---|---|---|---|")
    for mode, rs in runs.items():
        t = [r["ready_s"] for r in rs]
        print(f"| {mode} | {len(rs)} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) "
              f"| {statistics.median(r['cpu_s'] for r in rs):.2f} "
              f"| {statistics.median(r['rss_mib'] for r in rs):.0f} "
              f"| {sum(r['torch'] for r in rs)}/{len(rs)} |")


if __name__ == "__main__":
    main()
