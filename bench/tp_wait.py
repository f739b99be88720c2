"""What waiting for a gloo collective in liveness slices costs (parallel_state.py): all_reduce
over two real ranks on this machine, through TensorParallel's own `_run`, with the sliced wait
(the shipped path) and the plain blocking call, alternating (sliced, plain, plain, sliced) per
round; medians of microseconds per call.

    python -m bench.tp_wait --calls 20000 --rounds 3 --numel 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

RANK_1 = """
import sys, torch
from radixflow.runtime.distributed.layout import Layout
from radixflow.runtime.distributed.parallel_state import TensorParallel
addr, runs, calls, numel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tp = TensorParallel(1, Layout(2), torch.device("cpu"), None, addr, 60.0)
tp._join("gloo")
x = torch.ones(numel)
for _ in range(runs * calls):
    tp.all_reduce(x)
tp.close()
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--numel", type=int, default=2048, help="float32 elements per all_reduce")
    args = ap.parse_args()

    import torch

    from radixflow.runtime.distributed.layout import Layout
    from radixflow.runtime.distributed.parallel_state import TensorParallel
    from radixflow.runtime.ipc import free_port

    order = ["sliced", "plain", "plain", "sliced"] * args.rounds
    addr = f"127.0.0.1:{free_port()}"
    peer = subprocess.Popen([sys.executable, "-c", RANK_1, addr, str(len(order)),
                             str(args.calls), str(args.numel)])
    tp = TensorParallel(0, Layout(2), torch.device("cpu"), None, addr, 60.0)
    try:
        tp._join("gloo")
        liveness, x = tp._liveness, torch.ones(args.numel)
        us: dict[str, list[float]] = {"sliced": [], "plain": []}
        for mode in order:
            tp._liveness = liveness if mode == "sliced" else None  # None: the plain call
            start = time.perf_counter()
            for _ in range(args.calls):
                tp.all_reduce(x)
            us[mode].append((time.perf_counter() - start) / args.calls * 1e6)
        tp._liveness = liveness
    finally:
        tp.close()
        peer.wait(60)
    print(json.dumps({"numel": args.numel, "calls": args.calls, "us_per_call": us,
                      "median_us": {k: round(statistics.median(v), 1) for k, v in us.items()}}))


if __name__ == "__main__":
    main()
