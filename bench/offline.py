"""Offline throughput: radixflow's in-process Engine vs Hugging Face transformers, side by side.

The baseline is written the way a typical user would: `model.generate` on one prompt at a
time, greedy, the same prompts and output lengths. Runs one after the other, never at once.

    python -m bench.offline        # all workloads: a section of bench/results/offline.md
    python -m bench.offline --workloads single --requests 8
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from radixflow.runtime.model_loader.hf_folder import transformers_model

from . import workloads as wl
from .report import Run, publish, run_key

WORKLOADS = ("shared_prefix", "random_short")


BANDWIDTH_GB_S = 37.5  # this kind of machine's read bandwidth, ../shared/PEERS.md
BF16_BOUND_TOK_S = 140  # 270 MB of bf16 weights per token at that bandwidth

def chat_prompts(tokenizer, name: str, num: int, seed: int) -> tuple[list[str], int]:
    """The same seeded sessions the HTTP load generator sends, rendered with the chat template."""
    workload = wl.build(name, num_sessions=num, seed=seed)
    prompts = []
    for session in workload.sessions:
        messages = [{"role": "system", "content": session.system}] if session.system else []
        messages.append({"role": "user", "content": session.turns[0].user})
        prompts.append(tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True))
    return prompts, workload.sessions[0].turns[0].max_tokens


def run_radixflow(engine, prompts: list[str], max_new_tokens: int) -> dict:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    out_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    return {"wall_s": wall, "output_tokens": out_tokens, "tok_per_s": out_tokens / wall,
            "prompt_tokens": sum(r["meta_info"]["prompt_tokens"] for r in results),
            "cached_tokens": sum(r["meta_info"]["cached_tokens"] for r in results)}


def run_hf(model, tokenizer, prompts: list[str], max_new_tokens: int) -> dict:
    start = time.perf_counter()
    out_tokens = 0
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.eos_token_id)
        out_tokens += out.shape[1] - ids.shape[1]
    wall = time.perf_counter() - start
    return {"wall_s": wall, "output_tokens": out_tokens, "tok_per_s": out_tokens / wall}


def single_stream(engine, tokenizer, new_tokens: int, repeats: int) -> dict:
    """TTFT and per-token decode time of one request alone (streamed, medians of repeats)."""
    prompt = chat_prompts(tokenizer, "random_short", 1, seed=7)[0][0]
    tpots, ttfts = [], []
    for r in range(repeats):
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        start = time.perf_counter()
        stamps = []
        for event in engine.generate(f"{r} {prompt}", params, stream=True):
            stamps.append((time.perf_counter(), event["meta_info"]["completion_tokens"]))
        ttfts.append(stamps[0][0] - start)
        (t0, n0), (t1, n1) = stamps[0], stamps[-1]
        tpots.append((t1 - t0) / (n1 - n0))
    return {"ttft_ms": statistics.median(ttfts) * 1e3, "tpot_ms": statistics.median(tpots) * 1e3,
            "tok_per_s": 1 / statistics.median(tpots)}


def hf_single_stream(model, tokenizer, new_tokens: int, repeats: int) -> dict:
    prompt = chat_prompts(tokenizer, "random_short", 1, seed=7)[0][0]
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    times = []
    for _ in range(repeats):
        with torch.inference_mode():
            start = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=tokenizer.eos_token_id)
            times.append(time.perf_counter() - start)
    return {"tok_per_s": new_tokens / statistics.median(times)}


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step at batch 1 reads (the embedding row aside)."""
    from radixflow.runtime.models.cpu_linear import PackedLinear
    from radixflow.runtime.models.quant_linear import QuantLinear

    def nbytes(*tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    total, bf16_copies = 0, set()
    for module in model.modules():
        if isinstance(module, QuantLinear):
            if getattr(module, "tiled", None) is not None:
                total += module.tiled.nbytes
            else:  # torch's int4 kernel
                total += nbytes(module.packed, module.scales_and_zeros)
            if module.dense is not None:
                bf16_copies.add(id(module.dense))  # used for more than max_rows rows only
    for module in model.modules():
        if id(module) in bf16_copies:
            continue
        if isinstance(module, PackedLinear):
            total += module.in_features * module.out_features * module.packed_weight.element_size()
        elif isinstance(module, torch.nn.Linear):
            total += nbytes(module.weight)
    return total


def profile_decode_step(engine, batch_size: int) -> str:
    """Top ops of decode steps at a given batch size (torch.profiler, self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    from radixflow.runtime.messages import GenerateReq
    from radixflow.runtime.sampling_params import SamplingParams

    sched = engine.scheduler
    engine.shutdown()  # drive the scheduler directly, no background thread
    while not sched.is_idle:  # an earlier profile's requests run to their end first
        sched.step([])
    ids = engine.tokenizer("Write a long story about a dragon.").input_ids
    reqs = [GenerateReq(rid=f"p{batch_size}-{i}", input_ids=[i + 10] + ids,
                        sampling=SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True))
            for i in range(batch_size)]
    sched.step(reqs)
    for _ in range(5):
        sched.step([])
    steps = 10
    c_step = sched.runner.cpu_decode
    if c_step is not None and batch_size <= c_step.max_batch:  # the C step's own timers
        c_step.step.profile(True)
        start = time.perf_counter()
        for _ in range(steps):
            sched.step([])
        ms = (time.perf_counter() - start) / steps * 1e3
        rows = [f"| {name} | {sec / steps * 1e3:.3f} |"
                for name, sec in c_step.step.profile(False).items()]
        return (f"decode step at batch {batch_size}: {ms:.2f} ms, in radixflow's C decode step "
                "(thread 0's time per phase, waits included):\n\n| phase | ms |\n|---|---|\n"
                + "\n".join(rows) + "\n")
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            sched.step([])
    ms = (time.perf_counter() - start) / steps * 1e3
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    return (f"decode step at batch {batch_size}: {ms:.1f} ms under the profiler\n\n"
            f"```\n{table}\n```\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["shared_prefix", "random_short", "single"])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--baseline-requests", type=int, default=16,
                    help="requests the (sequential) HF baseline runs; "
                         "its tok/s does not depend on it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--profile", action="store_true", help="append a decode-step profile")
    ap.add_argument("--quantization", default="auto", choices=["auto", "none", "int4"])
    ap.add_argument("--compile", action="store_true", help="Engine(enable_torch_compile=True)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine

    engine = Engine(None, max_total_tokens=100_000, quantization=args.quantization,
                    enable_torch_compile=args.compile)
    tokenizer = engine.tokenizer
    raw = {"date": datetime.date.today().isoformat(), "machine": platform.machine(),
           "threads": torch.get_num_threads(), "weights": engine.scheduler.runner.quantization,
           "weight_bytes_per_token": decode_weight_bytes(engine.scheduler.runner.model),
           "results": {}}
    for name in args.workloads:
        if name == "single":
            continue
        prompts, out_len = chat_prompts(tokenizer, name, args.requests, args.seed)
        engine.generate(["warm up"], {"max_new_tokens": 4})
        ours = run_radixflow(engine, prompts, out_len)
        raw["results"][name] = {"radixflow": ours}
        print(name, "radixflow", json.dumps(ours))
    single = None
    if "single" in args.workloads:
        single = single_stream(engine, tokenizer, 128, repeats=3)
        raw["results"]["single"] = {"radixflow": single}
        print("single radixflow", json.dumps(single))
    profile = ""
    if args.profile:
        profile = profile_decode_step(engine, 1) + "\n" + profile_decode_step(engine, 16)
    engine.shutdown()
    del engine

    if not args.no_baseline:

        from radixflow.runtime.model_loader import resolve_model

        folder = resolve_model(None)
        hf = transformers_model(folder, torch.bfloat16)
        for name in args.workloads:
            if name == "single":
                raw["results"]["single"]["hf"] = hf_single_stream(hf, tokenizer, 128, repeats=3)
                continue
            prompts, out_len = chat_prompts(tokenizer, name, args.baseline_requests, args.seed)
            raw["results"][name]["hf"] = run_hf(hf, tokenizer, prompts, out_len)
            print(name, "hf", json.dumps(raw["results"][name]["hf"]))

    lines = [f"# Offline throughput, {raw['date']}", "",
             f"Command: `python -m bench.offline --workloads {' '.join(args.workloads)} "
             f"--requests {args.requests} "
             f"--baseline-requests {args.baseline_requests}"
             f"{' --profile' if args.profile else ''}"
             f"{' --quantization ' + args.quantization if args.quantization != 'auto' else ''}"
             f"{' --compile' if args.compile else ''}"
             f"{' --no-baseline' if args.no_baseline else ''}`",
             "", f"Machine: {raw['machine']} ({raw['threads']} torch threads); default model "
             "SmolLM2-135M-Instruct, bf16"
             f"{' with int4 weights' if raw['weights'] == 'int4' else ''}"
             f"{', compiled decode step' if args.compile else ''}, "
             "greedy, ignore_eos (fixed output lengths).", "",
             "| workload | radixflow tok/s | HF tok/s | ratio | cached prompt tokens |",
             "|---|---|---|---|---|"]
    for name, res in raw["results"].items():
        ours, hf = res["radixflow"], res.get("hf")
        ratio = f"{ours['tok_per_s'] / hf['tok_per_s']:.1f}x" if hf else "-"
        cached = (f"{ours['cached_tokens']} / {ours['prompt_tokens']}"
                  if "cached_tokens" in ours else "-")
        hf_tps = f"{hf['tok_per_s']:.1f}" if hf else "-"
        lines.append(f"| {name} | {ours['tok_per_s']:.1f} | {hf_tps} | {ratio} | {cached} |")
    if single:
        bound = BANDWIDTH_GB_S * 1e9 / raw["weight_bytes_per_token"]
        lines += ["", f"Single request: TTFT {single['ttft_ms']:.0f} ms, decode "
                  f"{single['tpot_ms']:.2f} ms/token = {single['tok_per_s']:.0f} tok/s: "
                  f"{single['tok_per_s'] / BF16_BOUND_TOK_S * 100:.0f}% of the ~{BF16_BOUND_TOK_S} "
                  f"tok/s bound of reading bf16 weights (270 MB/token), "
                  f"{single['tok_per_s'] / bound * 100:.0f}% of the ~{bound:.0f} tok/s bound of "
                  f"the {raw['weight_bytes_per_token'] / 1e6:.0f} MB this engine reads per token "
                  f"({BANDWIDTH_GB_S} GB/s, ../shared/PEERS.md)."]
    if profile:
        lines += ["", "## Where a decode step's time goes", "", profile]
    text = "\n".join(lines) + "\n"
    key = run_key(raw["date"], "" if args.quantization == "auto" else args.quantization,
                  "compiled" if args.compile else "")
    publish(text, args.out or Run("offline", key), raw)


if __name__ == "__main__":
    main()
