"""Structured generation cost: the json_extract workload under its JSON Schema vs the same
prompts free-form with the same output lengths, on the in-process Engine (default model).

Reports the throughput ratio (target >= 0.9x), % valid outputs (target 100%), bitmask time
per constrained token, forward passes per output token with jump-forward on and off, and the
time to first token of a never-seen schema (compiled on the request's path) vs a cached one.
"Forward passes per token" counts each request once per forward it takes part in, so 1.0 is
one forward per sampled token and jump-forward brings it below that.

    python -m bench.structured               # 64 requests -> bench/results/structured.md
    python -m bench.structured --requests 4  # smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from dataclasses import asdict
from pathlib import Path

from bench.report import Run, publish
from bench.workloads import PROFILE_SCHEMA, json_extract

MAX_NEW_TOKENS = 128


def chat_prompts(tokenizer, num: int, seed: int) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": s.turns[0].user}],
                                          tokenize=False, add_generation_prompt=True)
            for s in json_extract(num, seed)]


def flush(engine) -> None:
    """Empty the radix cache, so that no run reuses the prompts of the run before it."""
    for _ in range(100):
        if engine.flush_cache():
            return
        time.sleep(0.05)
    raise RuntimeError("the engine did not go idle")


def timed(engine, prompts: list[str], params: list[dict]) -> tuple[list[dict], dict]:
    """Run one batch from an empty cache: outputs, and wall time / tokens / forward passes /
    grammar counters of the run."""
    flush(engine)
    scheduler = engine.scheduler
    passes, request_passes = scheduler.num_forward_passes, scheduler.num_request_forwards
    grammar = asdict(scheduler.grammars.stats)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    after = asdict(scheduler.grammars.stats)
    return outputs, {"wall_s": wall, "output_tokens": tokens, "tok_per_s": tokens / wall,
                     "forward_passes": scheduler.num_forward_passes - passes,
                     "request_forwards": scheduler.num_request_forwards - request_passes,
                     **{k: after[k] - grammar[k] for k in after}}


def constrained(engine, prompts: list[str]) -> tuple[list[dict], dict]:
    from bench.workloads import validate_profile

    schema = json.dumps(PROFILE_SCHEMA)
    engine.generate(prompts[0], {"json_schema": schema, "max_new_tokens": 4})  # compile it
    params = [{"json_schema": schema, "max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}] * len(
        prompts)
    outputs, run = timed(engine, prompts, params)
    problems = [validate_profile(o["text"]) for o in outputs]
    run["num_valid"] = sum(p is None for p in problems)
    run["problems"] = [p for p in problems if p is not None][:5]
    run["finish_types"] = [o["meta_info"]["finish_reason"]["type"] for o in outputs]
    return outputs, run


def free_form(engine, prompts: list[str], outputs: list[dict]) -> dict:
    """The same prompts unconstrained, each as long as its constrained output."""
    params = [{"max_new_tokens": max(1, o["meta_info"]["completion_tokens"]), "temperature": 0,
               "ignore_eos": True} for o in outputs]
    return timed(engine, prompts, params)[1]


def first_token_s(engine, prompt: str, schema: dict) -> float:
    """Latency of a one-token request (queue + compile + prefill + first sample)."""
    start = time.perf_counter()
    engine.generate(prompt, {"json_schema": json.dumps(schema), "max_new_tokens": 1})
    return time.perf_counter() - start


def ttft(engine, prompts: list[str], trials: int) -> dict:
    """Median first-token latency with a never-seen schema (each trial a new one) vs the
    cached schema; each trial has its own prompt, so no prompt is cached either."""
    first_token_s(engine, "warm up", PROFILE_SCHEMA)
    new, cached = [], []
    for k in range(trials):
        fresh = {**PROFILE_SCHEMA, "title": f"profile {k} {time.time_ns()}"}
        new.append(first_token_s(engine, f"{k} new. {prompts[k % len(prompts)]}", fresh))
        cached.append(first_token_s(engine, f"{k} old. {prompts[k % len(prompts)]}",
                                    PROFILE_SCHEMA))
    return {"new_schema_ms": statistics.median(new) * 1e3,
            "cached_schema_ms": statistics.median(cached) * 1e3}


def mask_cost(engine, outputs: list[dict], repeats: int = 5) -> dict:
    """Filling and applying one batch's bitmask with the engine idle (no forward competing
    for the cores), per row: grammar states replayed to the middle of each output."""
    import torch

    from radixflow.kernels.bitmask import apply_bitmask_

    backend = engine.scheduler.grammars.backend
    compiled = backend.compile("json_schema", json.dumps(PROFILE_SCHEMA))
    states = []
    for out in outputs:
        state = backend.new_state(compiled)
        if all(state.accept_token(t) for t in out["output_ids"][:len(out["output_ids"]) // 2]):
            states.append(state)
    bitmask = backend.allocate_bitmask(len(states))  # [bs, words]
    logits = torch.randn(len(states), backend.vocab_size)  # [bs, vocab]
    start = time.perf_counter()
    for _ in range(repeats):
        backend.fill_bitmasks(states, bitmask)
    fill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        apply_bitmask_(logits, bitmask)
    apply = time.perf_counter() - start
    rows = repeats * max(len(states), 1)
    return {"batch": len(states), "fill_ms_per_row": fill / rows * 1e3,
            "apply_ms_per_row": apply / rows * 1e3}


def per_token(run: dict) -> dict:
    masked = max(run["num_masked_rows"], 1)
    return {"passes_per_token": run["request_forwards"] / max(run["output_tokens"], 1),
            "fill_ms_per_token": run["mask_fill_s"] / masked * 1e3,
            "wait_ms_per_token": run["mask_wait_s"] / masked * 1e3}


def report(args: argparse.Namespace, raw: dict) -> str:
    on, off = raw["jump_on"], raw["jump_off"]
    n = args.requests
    on_t, off_t = per_token(on), per_token(off)
    lines = [f"# Structured generation, {raw['date']}", "",
             (f"Command: `python -m bench.structured --requests {n} --seed {args.seed} "
             f"--ttft-trials {args.ttft_trials}`"), "",
             (f"Machine: {raw['machine']}; default model SmolLM2-135M-Instruct through the "
             f"in-process Engine, greedy, json_extract prompts ({n} requests in one batch, "
             f"JSON Schema, up to {MAX_NEW_TOKENS} tokens); free-form runs the same prompts "
             "with ignore_eos and each prompt's output length in the constrained run it is "
             "compared with. Every run starts from an empty radix cache.")]
    if n < 16:
        lines += ["", f"NOTE: a smoke run ({n} requests): the numbers are not a measurement."]
    lines += ["", ("| run | tok/s | free-form tok/s | ratio | valid | cut by max_tokens | "
              "forward passes "
              "/ token | batch forwards | mask fill ms / token | mask wait ms / token | jumps "
              "(forced tokens) |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, run, t in (("JSON Schema, jump-forward on", on, on_t),
                         ("JSON Schema, jump-forward off", off, off_t)):
        free = run["free_form"]
        lines.append(
            f"| {name} | {run['tok_per_s']:.1f} | {free['tok_per_s']:.1f} | "
            f"{run['tok_per_s'] / free['tok_per_s']:.2f}x "
            f"| {run['num_valid']}/{n} | {run['finish_types'].count('length')} | "
            f"{t['passes_per_token']:.3f} | {run['forward_passes']} | "
            f"{t['fill_ms_per_token']:.3f} | {t['wait_ms_per_token']:.3f} | "
            f"{run['num_jumps']} ({run['num_forced_tokens']}) |")
    cost = raw["mask_cost"]
    lines += ["", ("Mask fill runs on a CPU thread while the model computes (its wall time "
              "there includes waiting for a core); mask wait is what sampling still waited "
              "for it, the part on the critical path. With the engine idle, filling a batch "
              f"of {cost['batch']} rows costs {cost['fill_ms_per_row']:.3f} ms per row and "
              f"applying it {cost['apply_ms_per_row']:.3f} ms per row."), "",
              (f"First-token latency (median of {args.ttft_trials}): never-seen schema "
              f"{raw['ttft']['new_schema_ms']:.0f} ms, cached schema "
              f"{raw['ttft']['cached_schema_ms']:.0f} ms.")]
    problems = on["problems"] + off["problems"]
    if problems:
        lines += ["", "Invalid outputs (first few): " + "; ".join(problems)]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttft-trials", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine

    raw = {"date": datetime.date.today().isoformat(), "machine": platform.processor() or "-"}
    with Engine(None, max_total_tokens=100_000) as engine:
        prompts = chat_prompts(engine.tokenizer, args.requests, args.seed)
        engine.generate(["warm up"], {"max_new_tokens": 4})
        outputs, raw["jump_on"] = constrained(engine, prompts)
        raw["jump_on"]["free_form"] = free_form(engine, prompts, outputs)
        raw["mask_cost"] = mask_cost(engine, outputs)
        print("jump on", json.dumps(raw["jump_on"]))
    with Engine(None, max_total_tokens=100_000, disable_jump_forward=True) as engine:
        engine.generate(["warm up"], {"max_new_tokens": 4})
        outputs, raw["jump_off"] = constrained(engine, prompts)
        raw["jump_off"]["free_form"] = free_form(engine, prompts, outputs)
        raw["ttft"] = ttft(engine, prompts, args.ttft_trials)
        print("jump off", json.dumps(raw["jump_off"]), "\nttft", json.dumps(raw["ttft"]))

    text = report(args, raw)
    publish(text, args.out or Run("structured", raw["date"]), raw)


if __name__ == "__main__":
    main()
