"""radixflow beside llama.cpp at model scale, on the same GGUF files (issue #26's study).

For each file, the servers run one at a time in the order radixflow, llama.cpp, llama.cpp,
radixflow (a drifting machine then cannot make the result), and each runs the same four
measurements over streaming chat completions (greedy, fixed output lengths):

- single stream: 8 requests of ~128 prompt tokens and 64 output tokens, one at a time: TPOT;
- 16 requests, 8 at a time (the same shape): output tok/s;
- TTFT cold: a fresh ~1,000-token system prompt plus a ~30-token question (3 of them, median);
- TTFT warm: after each cold one, the same system prompt with another question, so only the
  suffix is new: what a prefix cache saves (llama.cpp reuses its slot's cached prompt).

Each server's peak resident memory (the whole process tree, sampled every 0.2 s) is recorded,
and TPOT is set against the bandwidth bound of the bytes one step reads: radixflow's from its
/get_server_info (`decode_step_weight_bytes`), llama.cpp's from the file (bench/gguf_bytes.py),
K/V at the mean context on top, at the copy bandwidth measured right before each server starts
(this VM's figure moves 43-72 GB/s between runs, so each run is set against its own).

    python -m bench.scale_models --llama-cpp /tmp/anchor-llamacpp --out /tmp/scale \\
        --models llama-1b qwen2.5-3b --types Q4_K_M Q4_0
    python -m bench.scale_serving --llama-server /tmp/anchor-llamacpp/build/bin/llama-server \\
        /tmp/scale/llama-1b-Q4_K_M.gguf /tmp/scale/llama-1b-Q4_0.gguf \\
        /tmp/scale/qwen2.5-3b-Q4_K_M.gguf
    python -m bench.scale_serving --cpu-isa avx2 \\
        --llama-server /tmp/llamacpp-avx2/bin/llama-server /tmp/scale/llama-1b-Q4_K_M.gguf
        # against an AVX2-only build of llama.cpp (GGML_NATIVE=OFF, GGML_AVX2=ON, no AVX-512)

A section of bench/results/scale-serving.md per run (its key names the level), with a plot of
TPOT and batch throughput against model size; raw JSON under bench/results/raw/scale-serving/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from . import workloads as wl
from .loadgen import run_workload
from .peers import default_llama_args, llama_cpp_command, serving, torch_capped_to
from .report import Run, publish, raw_dir, run_key

CONCURRENCY = 8
TTFT_PAIRS = 3


def scenarios(seed: int) -> dict[str, wl.Workload]:
    single = wl.build("random_short", num_sessions=8, concurrency=1, seed=seed)
    batch = wl.build("random_short", num_sessions=16, concurrency=CONCURRENCY, seed=seed + 1)
    sessions = []
    for pair in range(TTFT_PAIRS):  # cold (a new system prompt), then warm (the same one)
        sessions += wl.shared_prefix(2, seed=seed + 100 + pair)
    for s in sessions:
        s.turns[0].max_tokens = 4
    ttft = wl.Workload("ttft", sessions, concurrency=1, meta={"seed": seed})
    return {"single stream": single, "8 at a time": batch, "ttft": ttft}


def tree_rss(pid: int, itself: bool = True) -> int:
    """Resident bytes of `pid` (unless not `itself`) and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    if not itself:
        todo = children.get(pid, [])
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += children.get(p, [])
    return total


@contextlib.contextmanager
def peak_rss() -> Iterator[dict]:
    """Samples the resident bytes of every process this one started (a server and whatever it
    starts) every 0.2 s while the block runs, loading included; yields {"peak": bytes}."""
    got, stop = {"peak": 0}, threading.Event()

    def sample() -> None:
        while not stop.is_set():
            got["peak"] = max(got["peak"], tree_rss(os.getpid(), itself=False))
            stop.wait(0.2)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        stop.set()
        thread.join()


def measure(url: str, seed: int) -> dict:
    runs = {name: asyncio.run(run_workload(url, w)) for name, w in scenarios(seed).items()}
    ttft = [r for r in runs["ttft"]["requests"] if r["ok"]]
    cold = [r["ttft_s"] * 1e3 for r in ttft if r["session"] % 2 == 0]
    warm = [r["ttft_s"] * 1e3 for r in ttft if r["session"] % 2 == 1]
    single, batch = runs["single stream"]["summary"], runs["8 at a time"]["summary"]
    return {
        "tpot_ms": single["tpot_ms_p50"], "single_tok_s": single["output_tok_s"],
        "batch_tok_s": batch["output_tok_s"],
        "ttft_cold_ms": statistics.median(cold) if cold else None,
        "ttft_warm_ms": statistics.median(warm) if warm else None,
        "cold_prompt_tokens": statistics.median(r["prompt_tokens"] or 0 for r in ttft),
        "errors": sum(r["summary"]["errors"] for r in runs.values()),
        "single_context": statistics.mean(
            (r["prompt_tokens"] or 0) + r["completion_tokens"] / 2
            for r in runs["single stream"]["requests"] if r["ok"]),
        "raw": runs,
    }


def server_info(url: str) -> dict:
    import httpx

    return httpx.get(f"{url}/get_server_info", timeout=30).json()


def run_radixflow(model: Path, args, seed: int) -> dict:
    from radixflow.runtime.server.process import ServerProcess

    started = time.perf_counter()
    with peak_rss() as rss, torch_capped_to(args.cpu_isa), ServerProcess(
            str(model), port=30124, cpu_isa=args.cpu_isa, start_timeout=3600) as rt:
        healthy, load_peak = time.perf_counter() - started, rss["peak"]
        got = measure(rt.url, seed)
        info = server_info(rt.url)
    cpu = (info.get("model_info") or {}).get("cpu") or {}
    return {**got, "healthy_s": healthy, "peak_rss": rss["peak"], "load_peak_rss": load_peak,
            "kv_pool_tokens": (info.get("model_info") or {}).get("max_total_tokens"),
            "weight_bytes": cpu.get("decode_step_weight_bytes"), "weights": cpu.get("weights")}


def server_own_bytes(args) -> dict:
    """What radixflow holds for itself (issue #26's memory budget): its peak resident memory,
    all processes, serving the default model (start-up and a few requests), less the model's
    file, its KV pool and the bf16 copies of its weights a small model keeps."""
    from radixflow.runtime.model_loader import resolve_model
    from radixflow.runtime.server.process import ServerProcess

    folder = resolve_model(None)
    gguf = next(folder.glob("*.gguf"))
    with peak_rss() as rss, torch_capped_to(args.cpu_isa), ServerProcess(
            None, port=30124, cpu_isa=args.cpu_isa, start_timeout=600) as rt:
        import httpx

        for _ in range(3):
            httpx.post(f"{rt.url}/generate", json={"text": "Hello", "sampling_params": {
                "max_new_tokens": 16, "temperature": 0}}, timeout=120).raise_for_status()
        info = server_info(rt.url)["model_info"]
    kv = info["max_total_tokens"] * kv_bytes_per_token(gguf)
    copies = (((info.get("cpu") or {}).get("dense_weights") or {}).get("held_bytes")) or 0
    return {"peak": rss["peak"], "file": gguf.stat().st_size, "kv": kv, "dense_copies": copies,
            "own": rss["peak"] - gguf.stat().st_size - kv - copies}


def run_llama_cpp(model: Path, args, seed: int) -> dict:
    from .gguf_bytes import bytes_per_token

    opts = SimpleNamespace(llama_server=args.llama_server, threads=args.threads,
                           concurrency=CONCURRENCY, llama_args=args.llama_args)
    cmd = llama_cpp_command(opts, model)
    started = time.perf_counter()
    with peak_rss() as rss, serving(cmd, "http://127.0.0.1:18081") as url:
        healthy, load_peak = time.perf_counter() - started, rss["peak"]
        got = measure(url, seed)
    step = bytes_per_token(model)
    return {**got, "healthy_s": healthy, "peak_rss": rss["peak"], "load_peak_rss": load_peak,
            "weight_bytes": sum(step.parts.values()), "command": " ".join(cmd)}


def kv_bytes_per_token(model: Path) -> int:
    from .gguf_bytes import bytes_per_token

    return bytes_per_token(model).kv_per_token


def model_params(model: Path) -> float:
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(model).tensors) / 1e9


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


ROWS = [("single-stream TPOT (ms)", "tpot_ms", "lower"),
        ("single-stream output tok/s", "single_tok_s", "higher"),
        ("16 requests, 8 at a time: output tok/s", "batch_tok_s", "higher"),
        ("TTFT, ~1,000-token prompt (ms)", "ttft_cold_ms", "lower"),
        ("TTFT, 30-token suffix after the cached prefix (ms)", "ttft_warm_ms", "lower"),
        ("healthy after (s)", "healthy_s", "lower"),
        ("peak RSS while loading, all processes (GB)", "load_peak_rss_gb", "lower"),
        ("peak RSS, loading and serving, all processes (GB)", "peak_rss_gb", "lower"),
        ("bytes a decode step reads (MB, weights)", "weight_mb", "lower"),
        ("TPOT vs the bandwidth bound (weights + K/V)", "of_bound", "higher")]


def table(name: str, runs: dict[str, dict], kv_per_token: int) -> list[str]:
    for r in runs.values():
        r["peak_rss_gb"] = r["peak_rss"] / 1e9
        r["load_peak_rss_gb"] = r["load_peak_rss"] / 1e9
        r["weight_mb"] = r["weight_bytes"] / 1e6 if r.get("weight_bytes") else None
        if r.get("weight_bytes") and r.get("tpot_ms"):
            step = r["weight_bytes"] + kv_per_token * r["single_context"]
            r["of_bound"] = step / r["bandwidth"] * 1e3 / r["tpot_ms"]
    labels = list(runs)
    ours = [runs[k] for k in labels if k.startswith("radixflow")]
    theirs = [runs[k] for k in labels if k.startswith("llama.cpp")]
    lines = [f"### {name}", "", "| metric | " + " | ".join(labels) + " | radixflow vs llama.cpp "
             "(medians; >1 is radixflow better) |", "|---|" + "---|" * (len(labels) + 1)]
    for title, key, better in ROWS:
        cells = []
        for k in labels:
            v = runs[k].get(key)
            cells.append("-" if v is None else (f"{v:.0%}" if key == "of_bound" else f"{v:.3g}"))
        a, b = median_of(ours, key), median_of(theirs, key)
        ratio = "-"
        if a and b and key not in ("of_bound", "weight_mb"):
            ratio = f"{(b / a if better == 'lower' else a / b):.2f}x"
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {ratio} |")
    return lines


def plot(results: dict[str, dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for engine, marker in (("radixflow", "o"), ("llama.cpp", "s")):
        points = sorted((r["params_b"], r["name"],
                         median_of([v for k, v in r["runs"].items() if k.startswith(engine)],
                                   "tpot_ms"),
                         median_of([v for k, v in r["runs"].items() if k.startswith(engine)],
                                   "batch_tok_s")) for r in results.values())
        for ax, idx, label in ((axes[0], 2, "single-stream TPOT (ms)"),
                               (axes[1], 3, "16 requests, 8 at a time: output tok/s")):
            ax.plot([p[0] for p in points], [p[idx] for p in points], marker=marker,
                    label=engine)
            for p in points:
                ax.annotate(p[1].split("-", 2)[-1], (p[0], p[idx]), fontsize=7)
            ax.set_xlabel("parameters (billions)")
            ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="GGUF files both engines serve")
    ap.add_argument("--llama-server", type=Path, required=True)
    ap.add_argument("--llama-args", default=None,
                    help="extra llama-server flags (default: bench.peers' best configuration)")
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="", help="added to the results' section key (a second "
                    "run the same day keeps the first's section)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.llama_args is None:
        args.llama_args = default_llama_args()

    from radixflow.kernels.cpu.features import check_level

    from .decode_step import copy_bandwidth

    cpu = check_level(args.cpu_isa)
    own = server_own_bytes(args)
    date = datetime.date.today().isoformat()
    results: dict[str, dict] = {}
    for model in args.models:
        runs: dict[str, dict] = {}
        order = [("radixflow #1", run_radixflow), ("llama.cpp #1", run_llama_cpp),
                 ("llama.cpp #2", run_llama_cpp), ("radixflow #2", run_radixflow)]
        for label, run in order:
            print(f"{model.name}: {label}", flush=True)
            bandwidth = copy_bandwidth()
            runs[label] = {**run(model, args, args.seed), "bandwidth": bandwidth}
        results[model.stem] = {"name": model.stem, "params_b": model_params(model),
                               "file_gb": model.stat().st_size / 1e9,
                               "kv_per_token": kv_bytes_per_token(model), "runs": runs}

    key = run_key(date, args.cpu_isa if args.cpu_isa != "auto" else "", args.label)
    raw = raw_dir("scale-serving")
    raw.mkdir(parents=True, exist_ok=True)
    png = Path(__file__).parent / "results" / f"scale-serving-{key}.png"
    plot(results, png if not args.no_write else raw / png.name)
    caps = ("; radixflow's torch kernels capped to AVX2 too" if args.cpu_isa == "avx2" else "")
    llama_cmd = next(iter(results.values()))["runs"]["llama.cpp #1"]["command"]
    bandwidths = ", ".join(f"{r['bandwidth'] / 1e9:.1f}" for res in results.values()
                           for r in res["runs"].values()) + " GB/s"
    lines = [f"# radixflow vs llama.cpp at model scale, {date}", "",
             "Command: `python -m bench.scale_serving --llama-server "
             f"{args.llama_server}{f' --cpu-isa {args.cpu_isa}' if args.cpu_isa != 'auto' else ''}"
             f"{f' --label {args.label}' if args.label else ''}"
             f" {' '.join(str(m) for m in args.models)}`", "",
             f"CPU: {cpu.describe()}, {args.threads} threads{caps}. Copy bandwidth measured "
             f"before each server started: {bandwidths}.", "",
             f"- radixflow: `radixflow serve <file> --cpu-isa {args.cpu_isa}`, otherwise its "
             "defaults (a 1 GiB KV pool)",
             f"- llama.cpp: `{llama_cmd.replace(str(args.models[0]), '<file>')}`", "",
             "Random-weight models of real shapes from llama.cpp's own converter and "
             "llama-quantize (bench/scale_models.py). Servers one at a time, in the order "
             "radixflow, llama.cpp, llama.cpp, radixflow; ratios are of the two runs' medians.",
             "", f"![TPOT and throughput against model size]({png.name})", ""]
    for name, r in results.items():
        lines += table(f"{name} ({r['file_gb']:.2f} GB file, {r['params_b']:.2f} B "
                       "parameters)", r["runs"], r["kv_per_token"])
        ours = [r["runs"][k] for k in ("radixflow #1", "radixflow #2")]
        budget = (1.15 * r["file_gb"] * 1e9 + ours[0]["kv_pool_tokens"] * r["kv_per_token"]
                  + own["own"])
        lines += ["", f"Memory budget (issue #26: 1.15 x the file + the KV pool "
                  f"({ours[0]['kv_pool_tokens']} tokens) + what the server holds for itself, "
                  f"{own['own'] / 1e9:.2f} GB on the default model): {budget / 1e9:.2f} GB; "
                  f"radixflow's peaks {max(o['peak_rss'] for o in ours) / 1e9:.2f} GB."]
        weights = r["runs"]["radixflow #1"].get("weights") or {}
        lines += ["", "radixflow's layers: " + "; ".join(
            f"{role} {w['stored']} as {w['format']}" for role, w in weights.items()), ""]
    errors = sum(run["errors"] for r in results.values() for run in r["runs"].values())
    if errors:
        lines += [f"**{errors} requests failed** (raw JSON).", ""]
    (raw / f"{key}.json").write_text(json.dumps(
        {"server_own": own} | {k: {**r, "runs": {n: {kk: vv for kk, vv in v.items() if kk != "raw"}
                           for n, v in r["runs"].items()}} for k, r in results.items()},
        indent=1, default=str))
    publish("\n".join(lines), None if args.no_write else Run("scale-serving", key))


if __name__ == "__main__":
    main()
