"""How long a GGUF takes to load and how much memory it holds, as the server loads it.

    python -m bench.gguf_load /tmp/scale/llama-1b-Q4_K_M.gguf [--runs 3] [--cache DIR]

Each run is a fresh process: `prepare` is resolve_model (the folder of config, tokenizer and
gguf.json; only on the first run with an empty cache), `load` is ModelRunner (weights from the
file into the kernels' tiles, KV pool of --max-total-tokens), `peak_rss` the process's maximum
resident set. Prints one JSON line a run and the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, resource, sys, time
from radixflow.runtime.model_loader import load_config, resolve_model
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs
path, cache, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
folder = resolve_model(path, cache_dir=__import__("pathlib").Path(cache))
t1 = time.perf_counter()
runner = ModelRunner(ServerArgs(model=path, max_total_tokens=tokens), folder, load_config(folder))
t2 = time.perf_counter()
print(json.dumps({"prepare_s": t1 - t0, "load_s": t2 - t1,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "weights": runner.cpu_info()["weights"]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", default=None, help="cache dir (default: a fresh temp dir)")
    parser.add_argument("--max-total-tokens", type=int, default=4096)
    args = parser.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="rf-gguf-load-")
    runs = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", _CHILD, args.gguf, cache,
                              str(args.max_total_tokens)], capture_output=True, text=True,
                             check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "weights"}))
    print(json.dumps(runs[-1]["weights"]))
    later = runs[1:] or runs
    print(json.dumps({"first_prepare_s": runs[0]["prepare_s"],
                      "load_s_median": statistics.median(r["load_s"] for r in later),
                      "peak_rss_gb_median": statistics.median(r["peak_rss_gb"] for r in later)}))


if __name__ == "__main__":
    main()
