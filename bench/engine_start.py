"""How long `radixflow.Engine(model, tp_size=N)` takes to start in a fresh process, and the CPU
seconds that process and its rank subprocesses spend (resource.getrusage), this checkout
against a radixflow installed into DIR (`pip install --no-deps --target DIR <checkout>`),
alternating (a, b, b, a) per round.

    python -m bench.engine_start /tmp/tiny --tp-size 2 --against /tmp/rf-before --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, resource, sys, time
from radixflow.runtime.engine import Engine
t0 = time.monotonic()
with Engine(sys.argv[1], tp_size=int(sys.argv[2]), max_total_tokens=1024) as engine:
    start_s = time.monotonic() - t0
    engine.generate(["hello"], {"max_new_tokens": 4, "temperature": 0})
cpu = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"start_s": round(start_s, 2),
                  "cpu_s": round(sum(r.ru_utime + r.ru_stime for r in cpu), 2)}))
"""


def start_once(model: str, tp_size: int, pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(tp_size)], env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--tp-size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", required=True, metavar="DIR")
    args = ap.parse_args()
    modes = {"this checkout": None, f"--against {args.against}": args.against}
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    a, b = modes
    for _ in range(args.rounds):
        for mode in (a, b, b, a):
            runs[mode].append(start_once(args.model, args.tp_size, modes[mode]))
            print(mode, runs[mode][-1], flush=True)
    print("\n| mode | starts | s to started, median (min-max) | CPU s, median |")
    print("|---|---|---|---|")
    for mode, rs in runs.items():
        t = [r["start_s"] for r in rs]
        print(f"| {mode} | {len(rs)} | {statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) "
              f"| {statistics.median(r['cpu_s'] for r in rs):.2f} |")


if __name__ == "__main__":
    main()
