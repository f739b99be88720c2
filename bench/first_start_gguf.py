"""A GGUF's first start: `radixflow serve FILE.gguf` on an empty cache (the kernels' builds
shared), to the first 200 from /health: the preparation in a child process, the model's load,
the tokenizers. Prints seconds and the CPU seconds of the server's process tree (the
preparation's child included: it was waited for). One start a call, so that two checkouts
(git stash) can alternate:

    python -m bench.first_start_gguf /tmp/scale/models/llama-1b-Q4_K_M.gguf --label after
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.server_start import _cpu_s, _tree
from radixflow.kernels.cpu import build
from radixflow.runtime.server.process import ServerProcess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--label", default="")
    ap.add_argument("--max-total-tokens", type=int, default=4096)
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="radixflow-first-start-"))
    try:
        build.cache_dir().mkdir(parents=True, exist_ok=True)
        (cache / "kernels").symlink_to(build.cache_dir(), target_is_directory=True)
        os.environ["RADIXFLOW_CACHE"] = str(cache)
        t0 = time.monotonic()
        server = ServerProcess(args.gguf, max_total_tokens=args.max_total_tokens,
                               log_level="warning")
        ready_s = time.monotonic() - t0
        cpu_s = sum(_cpu_s(p) for p in _tree(server.proc.pid))
        server.shutdown()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(f"{args.label} first start {ready_s:.2f} s, CPU {cpu_s:.2f} s")


if __name__ == "__main__":
    main()
