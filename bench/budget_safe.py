"""Budget-safe structured output: the json_extract workload's valid-JSON rate with closing off
and on, at max_tokens 96 and a tight 48, and what the closing costs per token.

The requests are bench/structured.py's (json_extract prompts under the profile JSON Schema,
greedy) on the in-process Engine (default model), 16 running at once as the workload's
concurrency. Cost: the scheduler's time in budget checks and closings (GrammarStats
.budget_check_s, on its critical path) per decode pass and per checked token, against the
mean decode pass; then the check alone, replayed over the outputs with the engine idle.

    python -m bench.budget_safe                  # -> a section of bench/results/budget-safe.md
    python -m bench.budget_safe --requests 4     # smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

from bench.report import Run, publish
from bench.structured import chat_prompts, flush
from bench.workloads import PROFILE_SCHEMA, validate_profile

BUDGETS = (96, 48)


def cpu_isa() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    if "avx512_bf16" in flags:
        return "AVX-512 BF16"
    if "avx512f" in flags:
        return "AVX-512 (no BF16)"
    return "AVX2" if "avx2" in flags else "no AVX2"


def run(engine, prompts: list[str], max_tokens: int, budget_safe: bool) -> dict:
    flush(engine)
    scheduler = engine.scheduler
    before = asdict(scheduler.grammars.stats)
    passes = scheduler.num_forward_passes
    params = {"json_schema": json.dumps(PROFILE_SCHEMA), "max_new_tokens": max_tokens,
              "temperature": 0, "budget_safe": budget_safe}
    start = time.perf_counter()
    outputs = engine.generate(prompts, [params] * len(prompts))
    wall = time.perf_counter() - start
    stats = {k: v - before[k] for k, v in asdict(scheduler.grammars.stats).items()}
    problems = [validate_profile(o["text"]) for o in outputs]
    num_passes = scheduler.num_forward_passes - passes
    return {
        "max_tokens": max_tokens, "budget_safe": budget_safe, "wall_s": wall,
        "valid": sum(p is None for p in problems), "requests": len(outputs),
        "closed_early": sum(bool(o["meta_info"].get("closed_early")) for o in outputs),
        "length": sum(o["meta_info"]["finish_reason"]["type"] == "length" for o in outputs),
        "tokens": sum(o["meta_info"]["completion_tokens"] for o in outputs),
        "passes": num_passes, "pass_ms": wall / max(num_passes, 1) * 1e3,
        "check_us_per_pass": stats["budget_check_s"] / max(num_passes, 1) * 1e6,
        "check_us_per_token": stats["budget_check_s"] / max(stats["num_budget_checks"], 1)
        * 1e6,
        "searches": stats["num_budget_searches"], "problems": [p for p in problems if p][:3],
        "outputs": outputs,
    }


def replay_cost(engine, outputs: list[dict], max_tokens: int) -> dict:
    """The check alone (what `SchedulerGrammar.closing` does per sampled token), replayed over
    the outputs with nothing else running: µs per token, mean and worst."""
    backend = engine.scheduler.grammars.backend
    compiled = backend.compile("json_schema", json.dumps(PROFILE_SCHEMA))
    table, times = backend.table, []
    for out in outputs:
        state = backend.new_state(compiled, budget_safe=True)
        if not state.closer.start(state.matcher, max_tokens):
            continue
        for k, token in enumerate(out["output_ids"]):
            if token in backend.stop_token_ids:
                break
            start = time.perf_counter()
            assert state.matcher.accept_token(token)
            keep = state.closer.keep(state.matcher, table.token_bytes[token],
                                     max_tokens - k - 1)
            state.matcher.rollback(1)
            times.append(time.perf_counter() - start)
            if not keep or not state.accept_token(token):
                break
    times.sort()
    return {"tokens": len(times), "mean_us": sum(times) / max(len(times), 1) * 1e6,
            "p99_us": times[int(len(times) * 0.99)] * 1e6 if times else 0.0,
            "max_us": times[-1] * 1e6 if times else 0.0}


def markdown(runs: list[dict], replay: dict, args, isa: str) -> str:
    lines = [
        f"# Budget-safe structured output, {datetime.date.today()}", "",
        f"Machine: {platform.machine()}, {isa} (/proc/cpuinfo flags), "
        f"{len(Path('/proc/cpuinfo').read_text().split('processor')) - 1} cores; other "
        "processes were running during the runs (a shared machine), so times are noisy.",
        f"Command: `python -m bench.budget_safe --requests {args.requests}`", "",
        "Method: json_extract prompts (seed 0) under the profile JSON Schema, greedy, on the "
        "in-process Engine with the default model (SmolLM2-135M-Instruct), 16 requests "
        "running at once; each run from an empty radix cache. `budget_safe` off is the "
        "behaviour before this change. Cost = the scheduler's time in budget checks and "
        "closings (GrammarStats.budget_check_s) per decode pass, against the mean pass.", "",
        "| max_tokens | budget_safe | valid JSON | closed_early | finish length | tokens | "
        "mean pass ms | check µs/pass | check % of pass | check µs/token | searches |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        share = r["check_us_per_pass"] / 1e3 / max(r["pass_ms"], 1e-9) * 100
        lines.append(
            f"| {r['max_tokens']} | {'on' if r['budget_safe'] else 'off'} | "
            f"{r['valid']}/{r['requests']} | {r['closed_early']} | {r['length']} | "
            f"{r['tokens']} | {r['pass_ms']:.1f} | {r['check_us_per_pass']:.0f} | "
            f"{share:.2f}% | {r['check_us_per_token']:.1f} | {r['searches']} |")
    lines += ["", f"Check alone, replayed over the max_tokens {BUDGETS[-1]} outputs with the "
              f"engine idle: {replay['tokens']} tokens, mean {replay['mean_us']:.1f} µs, p99 "
              f"{replay['p99_us']:.0f} µs, max {replay['max_us']:.0f} µs per token.", ""]
    for r in runs:
        if r["problems"]:
            lines.append(f"- max_tokens {r['max_tokens']}, budget_safe "
                         f"{'on' if r['budget_safe'] else 'off'}: {r['problems']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from radixflow.runtime.engine import Engine

    isa = cpu_isa()
    with Engine(None, max_running_requests=16) as engine:
        prompts = chat_prompts(engine.tokenizer, args.requests, 0)
        engine.generate(prompts[0], {"json_schema": json.dumps(PROFILE_SCHEMA),
                                     "max_new_tokens": 4})  # compile, warm up
        runs = [run(engine, prompts, budget, safe) for budget in BUDGETS
                for safe in (False, True)]
        replay = replay_cost(engine, runs[-1]["outputs"], BUDGETS[-1])
    text = markdown(runs, replay, args, isa)
    publish(text, args.out or Run("budget-safe", str(datetime.date.today())))


if __name__ == "__main__":
    main()
