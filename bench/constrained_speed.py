"""Constrained decoding on the fast path: a single JSON-Schema or regex stream vs a free-form
stream of the same length, and a batch mixing constrained and free requests, on the in-process
Engine (default model, the C decode step where the CPU level has it).

Single stream: each json_extract prompt is decoded under the JSON Schema, under a regex of the
same record, and free-form (ignore_eos) with the constrained output's length, one request at a
time, the three taking turns prompt by prompt. The prompt is cached first, so each request's
time is one token of prefill plus its decode: tokens/s is output tokens over wall time.
Jump-forward on (the default: forced tokens cost no forward pass of their own) and off (every
token sampled: the per-token cost of masks alone).

Mixed batch: half the requests constrained, half free, submitted together; reports how many
decode passes ran in the C step (the rest fell back to torch ops).

    python -m bench.constrained_speed   # -> a section of bench/results/constrained-speed.md
    python -m bench.constrained_speed --prompts 2 --no-write   # smoke run
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

from bench.report import Run, publish, run_key
from bench.workloads import PROFILE_SCHEMA, json_extract, validate_profile

MAX_NEW_TOKENS = 128
# The profile record as a regex: the same fields and order as PROFILE_SCHEMA asks for.
PROFILE_REGEX = (r'\{"name": "[A-Z][a-z]+( [A-Z][a-z]+)?", "age": [1-9][0-9]?, '
                 r'"city": "[A-Z][a-z]+", "hobbies": \["[a-z]+"(, "[a-z]+"){0,2}\]\}')


def chat_prompts(tokenizer, num: int, seed: int) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": s.turns[0].user}],
                                          tokenize=False, add_generation_prompt=True)
            for s in json_extract(num, seed)]


class PassCounter:
    """Counts the runner's decode passes and how many of them the C step ran."""

    def __init__(self, runner):
        self.runner, self.decode_passes = runner, 0
        self._forward = runner.forward

        def forward(mode, parts, out_slots):
            if mode.name == "DECODE":
                self.decode_passes += 1
            return self._forward(mode, parts, out_slots)

        runner.forward = forward

    @property
    def c_calls(self) -> int:
        return self.runner.cpu_decode.calls if self.runner.cpu_decode is not None else 0


def timed(engine, prompt: str, params: dict) -> tuple[dict, float]:
    start = time.perf_counter()
    out = engine.generate(prompt, params)
    return out, time.perf_counter() - start


def single_streams(engine, prompts: list[str], rounds: int) -> dict:
    schema = json.dumps(PROFILE_SCHEMA)
    greedy = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0}
    rates: dict[str, list[float]] = {"json_schema": [], "regex": [], "free (json length)": [],
                                     "free (regex length)": []}
    valid = {"json_schema": 0, "regex": 0}
    for _ in range(rounds):
        for prompt in prompts:
            engine.generate(prompt, {"max_new_tokens": 1})  # the prompt is cached from here on
            for kind, extra in (("json_schema", {"json_schema": schema}),
                                ("regex", {"regex": PROFILE_REGEX})):
                out, wall = timed(engine, prompt, {**greedy, **extra})
                n = out["meta_info"]["completion_tokens"]
                valid[kind] += validate_profile(out["text"]) is None
                rates[kind].append(n / wall)
                free, free_wall = timed(engine, prompt, {"max_new_tokens": n, "temperature": 0,
                                                         "ignore_eos": True})
                label = "free (json length)" if kind == "json_schema" else "free (regex length)"
                rates[label].append(free["meta_info"]["completion_tokens"] / free_wall)
    return {"tok_per_s": {k: statistics.median(v) for k, v in rates.items()},
            "runs": len(rates["regex"]), "valid": valid}


def mixed_batch(engine, prompts: list[str]) -> dict:
    schema = json.dumps(PROFILE_SCHEMA)
    counter = PassCounter(engine.scheduler.runner)
    params = [{"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0,
               **({"json_schema": schema} if i % 2 == 0 else {"ignore_eos": True})}
              for i in range(len(prompts))]
    passes, calls = counter.decode_passes, counter.c_calls
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    engine.scheduler.runner.forward = counter._forward
    constrained = [o for i, o in enumerate(outs) if i % 2 == 0]
    return {"requests": len(prompts), "decode_passes": counter.decode_passes - passes,
            "c_step_passes": counter.c_calls - calls,
            "valid": sum(validate_profile(o["text"]) is None for o in constrained),
            "constrained": len(constrained),
            "tok_per_s": sum(o["meta_info"]["completion_tokens"] for o in outs) / wall}


def report(args, raw: dict) -> str:
    lines = [f"# Constrained decoding on the fast path, {raw['date']}", "",
             f"Command: `python -m bench.constrained_speed --prompts {args.prompts} "
             f"--rounds {args.rounds} --batch {args.batch} --cpu-isa {args.cpu_isa}`", "",
             f"CPU: {raw['cpu']}. Default model SmolLM2-135M-Instruct, in-process Engine, "
             f"greedy, json_extract prompts; decode step: {raw['decode_step']}.", "",
             "## One stream at a time (medians)", "",
             "| jump-forward | JSON Schema tok/s | free, same length | ratio | regex tok/s | "
             "free, same length | ratio | valid (JSON / regex) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("on", "off"):
        s = raw[f"single_jump_{name}"]
        t = s["tok_per_s"]
        lines.append(
            f"| {name} | {t['json_schema']:.1f} | {t['free (json length)']:.1f} | "
            f"{t['json_schema'] / t['free (json length)']:.2f}x | {t['regex']:.1f} | "
            f"{t['free (regex length)']:.1f} | {t['regex'] / t['free (regex length)']:.2f}x | "
            f"{s['valid']['json_schema']}/{s['runs']} / {s['valid']['regex']}/{s['runs']} |")
    lines += ["", "## Constrained and free requests in one batch", "",
              "| jump-forward | requests (half JSON Schema) | decode passes | in the C step | "
              "tok/s | valid JSON |", "|---|---|---|---|---|---|"]
    for name in ("on", "off"):
        m = raw[f"mixed_jump_{name}"]
        lines.append(f"| {name} | {m['requests']} | {m['decode_passes']} | "
                     f"{m['c_step_passes']} | {m['tok_per_s']:.1f} | "
                     f"{m['valid']}/{m['constrained']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"])
    ap.add_argument("--out", type=Path, default=None, help="a markdown file instead")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine

    raw = {"date": datetime.date.today().isoformat()}
    for jump in ("on", "off"):
        with Engine(None, max_total_tokens=100_000, disable_jump_forward=jump == "off",
                    cpu_isa=args.cpu_isa) as engine:
            runner = engine.scheduler.runner
            raw["cpu"] = runner.cpu.describe() if runner.device.type == "cpu" else "-"
            info = runner.cpu_info()
            raw["decode_step"] = f"{info['decode_step']} ({info['kernels']})" if info else "-"
            prompts = chat_prompts(engine.tokenizer, max(args.prompts, args.batch), args.seed)
            engine.generate(prompts[0], {"json_schema": json.dumps(PROFILE_SCHEMA),
                                         "max_new_tokens": 4})  # compile the schema once
            engine.generate(prompts[0], {"regex": PROFILE_REGEX, "max_new_tokens": 4})
            raw[f"single_jump_{jump}"] = single_streams(engine, prompts[:args.prompts],
                                                        args.rounds)
            raw[f"mixed_jump_{jump}"] = mixed_batch(engine, prompts[:args.batch])
            print(jump, json.dumps(raw[f"single_jump_{jump}"]),
                  json.dumps(raw[f"mixed_jump_{jump}"]))
    level = "" if args.cpu_isa == "auto" else args.cpu_isa
    publish(report(args, raw), None if args.no_write else
            args.out or Run("constrained-speed", run_key(raw["date"], level)), raw)


if __name__ == "__main__":
    main()
