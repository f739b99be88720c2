"""Prefill: time to first token of a long prompt, of a short suffix after a cached prefix, and
how running streams keep their pace while long prompts arrive; radixflow and the peers of
../shared/PEERS.md, one server at a time, the same seeded prompts, through /v1/completions.

- cold: a ~1,000-token prompt never seen before (each trial its own first words), 1 token out.
- cached: a ~30-token suffix after a ~1,000-token prefix the server has computed, 1 token out.
- under prefill: `--streams` requests decoding 192 tokens each; once they run, `--arrivals`
  cold ~1,000-token prompts arrive one a second. Reports the streams' gaps between tokens
  (their TPOT) while prompts arrive, p50 and p99, against the same streams alone.

    python -m bench.prefill --llama-server /work/peers/llamacpp/build/bin/llama-server \\
        --vllm-venv /work/peers/vllm-venv --alternate
    python -m bench.prefill --trials 2 --no-write            # radixflow alone, smoke run

Each run adds a section to bench/results/prefill.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from . import workloads as wl
from .loadgen import discover_model, percentile
from .peers import PEERS_DIR, default_llama_args, llama_cpp_command, serving, torch_capped_to
from .report import Run, publish, run_key

# wl.words' sizes assume 1.3 tokens a word; the default model's tokenizer makes ~1.0: these
# come out at ~1,000 and ~30 of its tokens (the report shows the counts the servers gave)
PROMPT_TOKENS = 1300
SUFFIX_TOKENS = 38
STREAM_TOKENS = 384


def long_prompt(seed: int, tokens: int = PROMPT_TOKENS) -> str:
    rng = random.Random(seed)
    return f"Document {seed}: " + wl.words(rng, tokens)


async def first_token(client: httpx.AsyncClient, url: str, model: str, prompt: str,
                      max_tokens: int = 1) -> dict:
    """Stream one completion: seconds to its first token, token arrival times, usage."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    arrivals, usage = [], None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            usage = event.get("usage") or usage
            if any(c.get("text") for c in event.get("choices") or []):
                arrivals.append(time.perf_counter())
    if not arrivals:
        raise RuntimeError(f"no tokens streamed for a {len(prompt)}-character prompt")
    return {"ttft_s": arrivals[0] - t0, "arrivals": arrivals, "usage": usage or {}}


def gaps(arrivals: list[float]) -> list[float]:
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


async def measure(url: str, trials: int, streams: int, arrivals: int, seed: int) -> dict:
    async with httpx.AsyncClient(timeout=600) as client:
        model = await discover_model(client, url)
        await first_token(client, url, model, "Hello there", 4)  # warm up
        cold = [await first_token(client, url, model, long_prompt(seed * 1000 + i))
                for i in range(trials)]
        prefix = long_prompt(seed * 1000 + 999)
        rng = random.Random(seed)
        await first_token(client, url, model, prefix + " Question: " + wl.words(rng, SUFFIX_TOKENS))
        cached = [await first_token(client, url, model, prefix + f" Question {i}: "
                                    + wl.words(rng, SUFFIX_TOKENS)) for i in range(trials)]

        async def stream(i: int, tag: str) -> dict:
            return await first_token(client, url, model, f"Story {tag} {i}: once upon a time",
                                     STREAM_TOKENS)

        alone = await asyncio.gather(*(stream(i, f"a{seed}") for i in range(streams)))
        decoding = [asyncio.create_task(stream(i, f"b{seed}")) for i in range(streams)]
        await asyncio.sleep(1.5)  # the streams are admitted and decoding
        first_sent = time.perf_counter()
        arriving = []
        for k in range(arrivals):
            arriving.append(asyncio.create_task(first_token(
                client, url, model, long_prompt(seed * 1000 + 500 + k))))
            await asyncio.sleep(1.0)
        loaded_prompts = await asyncio.gather(*arriving)
        loaded_streams = await asyncio.gather(*decoding)
    window_end = max(p["arrivals"][0] for p in loaded_prompts)
    loaded_gaps = [g for s in loaded_streams for a, g in zip(s["arrivals"][1:], gaps(s["arrivals"]))
                   if first_sent <= a <= window_end]
    alone_gaps = [g for s in alone for g in gaps(s["arrivals"])]

    def ms(xs: list[float], q: float) -> float | None:
        p = percentile(xs, q)
        return None if p is None else p * 1e3

    return {
        "cold_ttft_ms": statistics.median(c["ttft_s"] for c in cold) * 1e3,
        "cold_prompt_tokens": cold[0]["usage"].get("prompt_tokens"),
        "cached_ttft_ms": statistics.median(c["ttft_s"] for c in cached) * 1e3,
        "cached_prompt_tokens": cached[0]["usage"].get("prompt_tokens"),
        "cached_tokens": ((cached[0]["usage"].get("prompt_tokens_details") or {})
                          .get("cached_tokens")),
        "tpot_alone_p50_ms": ms(alone_gaps, 50), "tpot_alone_p99_ms": ms(alone_gaps, 99),
        "tpot_loaded_p50_ms": ms(loaded_gaps, 50), "tpot_loaded_p99_ms": ms(loaded_gaps, 99),
        "loaded_gap_count": len(loaded_gaps),
        "loaded_prompt_ttft_ms": statistics.median(p["ttft_s"] for p in loaded_prompts) * 1e3,
    }


def report(args, runs: dict[str, dict], cpu: str, setups: list[str]) -> str:
    cols = [("cold_ttft_ms", "TTFT, 1,000-token prompt (ms)"),
            ("cached_ttft_ms", "TTFT, 30 tokens after a cached 1,000 (ms)"),
            ("tpot_alone_p50_ms", f"TPOT p50, {args.streams} streams alone (ms)"),
            ("tpot_alone_p99_ms", "p99 alone (ms)"),
            ("tpot_loaded_p50_ms", "TPOT p50 while prompts arrive (ms)"),
            ("tpot_loaded_p99_ms", "p99 while prompts arrive (ms)"),
            ("loaded_prompt_ttft_ms", "those prompts' TTFT (ms)")]
    lines = [f"# Prefill: TTFT and TPOT under arriving prompts, {args.date}", "",
             f"Command: `{args.command}`", "", f"CPU: {cpu}.", "", *[f"- {s}" for s in setups],
             "", f"Medians of {args.trials} trials; prompts through /v1/completions, greedy, "
             f"streamed. Under prefill: {args.streams} streams of {STREAM_TOKENS} tokens, "
             f"{args.arrivals} cold ~1,000-token prompts arriving one a second; the streams' "
             "gaps between tokens from the first arrival to the last prompt's first token.", "",
             "| server | " + " | ".join(c[1] for c in cols) + " | prompt tokens (cold / cached, "
             "of them cached) |", "|---" * (len(cols) + 2) + "|"]
    for name, r in runs.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:200]} |")
            continue
        cells = [f"{r[k]:.0f}" if r[k] is not None else "-" for k, _ in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['cold_prompt_tokens']} / "
                     f"{r['cached_prompt_tokens']}, {r['cached_tokens']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--llama-args", default=None,
                    help="extra llama-server flags (default: bench.peers's default_llama_args)")
    ap.add_argument("--vllm-venv", type=Path, default=None)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--arrivals", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"])
    ap.add_argument("--serve-args", default="", help="extra radixflow serve flags")
    ap.add_argument("--alternate", action="store_true",
                    help="every server twice: radixflow, peers, peers reversed, radixflow")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    if args.llama_args is None:
        args.llama_args = default_llama_args()
    args.concurrency = args.streams + args.arrivals  # llama.cpp's slots
    args.date = datetime.date.today().isoformat()

    from radixflow.kernels.cpu.features import check_level
    from radixflow.runtime.model_loader import resolve_model
    from radixflow.runtime.model_loader.default_model import fetch_default_gguf
    from radixflow.runtime.server.process import ServerProcess

    cpu = check_level(args.cpu_isa)
    runs: dict[str, dict] = {}
    setups = [f"radixflow: `radixflow serve --cpu-isa {args.cpu_isa} {args.serve_args}`"]

    def run(url: str) -> dict:
        try:
            return asyncio.run(measure(url, args.trials, args.streams, args.arrivals, args.seed))
        except (httpx.HTTPError, RuntimeError) as exc:  # the report says which server failed
            return {"error": f"{type(exc).__name__}: {exc}"}

    def radixflow(label: str) -> None:
        extra = {}
        for flag in args.serve_args.split():
            key, _, value = flag.removeprefix("--").partition("=")
            extra[key.replace("-", "_")] = type_of(key)(value) if value else True
        with torch_capped_to(args.cpu_isa), ServerProcess(None, port=30125, cpu_isa=args.cpu_isa,
                                                          **extra) as rt:
            runs[label] = run(rt.url)

    def llama_cpp(label: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            gguf = fetch_default_gguf(Path(tmp))
            cmd = llama_cpp_command(args, gguf)
            with serving(cmd, "http://127.0.0.1:18081") as url:
                runs[label] = run(url)
        if not any(s.startswith("llama.cpp") for s in setups):
            setups.append(f"llama.cpp: `llama-server "
                          f"{' '.join(cmd[1:]).replace(str(gguf), gguf.name)}` (Q4_1 GGUF)")

    def vllm(label: str) -> None:
        env = {**os.environ, "VENV": str(args.vllm_venv), "PORT": "18090",
               "MODEL": str(resolve_model(None)), "THREADS": str(args.threads)}
        with serving(["bash", str(PEERS_DIR / "vllm-serve.sh")], "http://127.0.0.1:18090",
                     env=env) as url:
            runs[label] = run(url)
        if not any(s.startswith("vLLM") for s in setups):
            setups.append("vLLM CPU 0.32: `../shared/peers/vllm-serve.sh` (bf16, prefix caching)")

    order = [("radixflow", radixflow)]
    if args.llama_server is not None:
        order.append(("llama.cpp", llama_cpp))
    if args.vllm_venv is not None:
        order.append(("vLLM CPU", vllm))
    passes = [order, order[::-1]] if args.alternate else [order]
    for i, servers in enumerate(passes):
        for name, fn in servers:
            fn(f"{name} #{i + 1}" if args.alternate else name)
            print(name, runs[f"{name} #{i + 1}" if args.alternate else name], flush=True)
    args.command = ("python -m bench.prefill"
                    + (f" --llama-server {args.llama_server}" if args.llama_server else "")
                    + (f" --llama-args={args.llama_args!r}" if args.llama_args else "")
                    + (f" --vllm-venv {args.vllm_venv}" if args.vllm_venv else "")
                    + f" --trials {args.trials} --streams {args.streams} --arrivals "
                      f"{args.arrivals}"
                    + (f" --cpu-isa {args.cpu_isa}" if args.cpu_isa != "auto" else "")
                    + (f" --serve-args={args.serve_args!r}" if args.serve_args else "")
                    + (" --alternate" if args.alternate else ""))
    level = "" if args.cpu_isa == "auto" else args.cpu_isa
    publish(report(args, runs, cpu.describe(), setups),
            None if args.no_write else Run("prefill", run_key(args.date, level)), runs)


def type_of(flag: str):
    import typing

    from radixflow.runtime.server_args import ServerArgs

    hint = typing.get_type_hints(ServerArgs).get(flag.replace("-", "_"), str)
    return hint if hint in (int, float, str) else str


if __name__ == "__main__":
    main()
