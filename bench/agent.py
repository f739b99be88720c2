"""Agent workload: a batch of ReAct programs (shared system prompt and few-shot examples, 3 steps
of gen + select + regex gen, a Python tool between steps) run with `run_batch` against
`radixflow serve` with the radix cache on, then with --disable-radix-cache, then the same logic
as plain OpenAI chat calls against the naive HF baseline (bench/hf_baseline_server.py); one
server at a time. Also: a 5-gen straight-line program through /program (one round trip) vs one
/generate per call, median latency ratio. Targets: >= 3x over cache-off, >= 10x over the baseline.

    python -m bench.agent                          # 32 programs: a section of
                                                   # bench/results/agent.md
    python -m bench.agent --programs 4 --trials 3  # smoke run: its section <date>-smoke
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import operator
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

import radixflow as rf
from bench.report import Run, publish, run_key

STEPS, GEN_TOKENS, STRAIGHT_GENS, STRAIGHT_TOKENS = 3, 24, 5, 16
ACTIONS = ["calculator", "search", "finish"]
REGEX = {"calculator": r"[0-9][0-9+\-*/(). ]{0,30}", "search": r"[a-z][a-z ]{0,30}",
         "finish": r"[A-Za-z0-9][A-Za-z0-9 .,]{0,40}"}
KNOWLEDGE = {
    "eiffel tower": "The Eiffel Tower is 330 metres tall and stands in Paris.",
    "mount everest": "Mount Everest is 8849 metres high.",
    "mount fuji": "Mount Fuji is 3776 metres high.",
    "nile river": "The Nile river is about 6650 km long.",
    "amazon river": "The Amazon river is about 6400 km long.",
    "great wall": "The Great Wall of China is about 21196 km long.",
    "paris": "Paris is the capital of France, with about 2.1 million inhabitants.",
    "moon": "The Moon is about 384400 km from the Earth.",
}
SYSTEM = """You are a careful assistant that solves tasks step by step with tools. Each step has \
three lines: "Thought:" (what you need next, one line), "Action:" (one tool name) and "Input:" \
(the tool's input). The user then answers with "Observation:" and the tool's result.
Tools:
- calculator: evaluates arithmetic with numbers, + - * / and parentheses, e.g. 12 * (3 + 4).
- search: looks up a fact about a place, river, mountain or building; input a few lowercase words.
- finish: gives the final answer to the user; input the answer in a few words.
Rules: use search for every fact you do not know for sure; use the calculator for every \
computation, even a simple one; never guess numbers; keep thoughts short; finish when you know \
the answer. Here are three solved examples.

Example 1
Question: How high is Mount Everest in km?
Thought: I need the height of Mount Everest first.
Action: search
Input: mount everest
Observation: Mount Everest is 8849 metres high.
Thought: Now I convert metres to kilometres.
Action: calculator
Input: 8849 / 1000
Observation: 8.849
Thought: I know the answer now.
Action: finish
Input: about 8.8 km

Example 2
Question: What is 17 * 23 + 4?
Thought: This is arithmetic, so I use the calculator.
Action: calculator
Input: 17 * 23 + 4
Observation: 395
Thought: The calculator gave the result.
Action: finish
Input: 395

Example 3
Question: How many times longer is the Nile river than the Eiffel Tower is tall, in metres?
Thought: I need the length of the Nile river.
Action: search
Input: nile river
Observation: The Nile river is about 6650 km long.
Thought: Now I need the height of the Eiffel Tower.
Action: search
Input: eiffel tower
Observation: The Eiffel Tower is 330 metres tall and stands in Paris.
Thought: 6650 km is 6650000 metres; I divide by 330.
Action: calculator
Input: 6650000 / 330
Observation: 20151.5
Thought: I know the answer now.
Action: finish
Input: about 20150 times"""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError("unsupported expression")

    try:
        return f"{walk(ast.parse(expression.strip(), mode='eval').body):.6g}"
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"


def run_tool(action: str, tool_input: str) -> str:
    if action == "calculator":
        return calculator(tool_input)
    if action == "search":
        words = set(tool_input.lower().split())
        best = max(KNOWLEDGE, key=lambda key: len(words & set(key.split())))
        return KNOWLEDGE[best] if words & set(best.split()) else "no result"
    return "Answer recorded."  # finish: every program still runs all STEPS, so all do equal work


def questions(num: int, seed: int) -> list[str]:
    rng, out = random.Random(seed), []
    things = ["Mount Everest", "Mount Fuji", "the Eiffel Tower", "the Nile river",
              "the Amazon river", "the Great Wall", "the Moon"]
    for i in range(num):
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        thing = rng.choice(things)
        out.append((f"What is {a} * {b} + {c}?", f"How big is {thing}, in km?",
                    f"What is {c} times the size of {thing}?")[i % 3])
    return out


@rf.function
def agent(s, question: str, latencies: list | None = None):
    start = time.perf_counter()
    s += rf.system(SYSTEM)
    s += rf.user("Question: " + question)
    for k in range(STEPS):
        with s.assistant():
            s += "Thought:" + rf.gen(f"thought{k}", max_tokens=GEN_TOKENS, stop="\n")
            s += "\nAction: " + rf.select(f"action{k}", choices=ACTIONS) + "\nInput: "
            action = s[f"action{k}"]  # Python picks the regex: the stretch ends here
            s += rf.gen(f"input{k}", regex=REGEX[action], max_tokens=GEN_TOKENS)
        s += rf.user("Observation: " + run_tool(action, s[f"input{k}"]))
    if latencies is not None:
        latencies.append(time.perf_counter() - start)


@rf.function
def straight_line(s, topic: str):
    s += f"Five short facts about {topic}.\n"
    for i in range(STRAIGHT_GENS):
        s += f"{i + 1}." + rf.gen(f"fact{i}", max_tokens=STRAIGHT_TOKENS, ignore_eos=True) + "\n"


def summary(wall: float, latencies: list[float], gen_tokens: int, num: int) -> dict:
    cuts = statistics.quantiles(latencies, n=10, method="inclusive") if len(latencies) > 1 else \
        latencies * 9
    return {"programs": num, "wall_s": wall, "programs_per_s": num / wall,
            "gen_tokens": gen_tokens, "gen_tok_per_s": gen_tokens / wall,
            "latency_p50_s": statistics.median(latencies), "latency_p90_s": cuts[8],
            "latencies_s": latencies}


def counters(url: str) -> dict:
    time.sleep(1.2)  # the scheduler reports its stats every 0.5 s
    info = requests.get(url + "/get_server_info", timeout=30).json()
    return {k: info.get(k, 0) for k in ("cache_hit_tokens", "prompt_tokens", "generation_tokens")}


def run_radixflow(backend: rf.Endpoint, qs: list[str], threads: int) -> dict:
    agent.run(question="Warm up: what is 2 + 2?", backend=backend, temperature=0)
    backend.flush_cache()
    before, latencies = counters(backend.url), []
    start = time.perf_counter()
    states = agent.run_batch([{"question": q, "latencies": latencies} for q in qs],
                             backend=backend, num_threads=threads, temperature=0)
    wall = time.perf_counter() - start
    after = counters(backend.url)
    failed = [str(st.error) for st in states if st.error is not None]
    if len(failed) == len(states):
        raise RuntimeError(f"every program failed, e.g. {failed[0]}")
    gen_tokens = sum(st.get_meta_info(f"{v}{k}")["completion_tokens"] for st in states
                     if st.error is None for k in range(STEPS) for v in ("thought", "input"))
    delta = {k: after[k] - before[k] for k in after}
    return {**summary(wall, latencies, gen_tokens, len(qs)), "failed": failed[:3],
            "cache_hit_rate": delta["cache_hit_tokens"] / max(delta["prompt_tokens"], 1),
            "actions": [[st[f"action{k}"] for k in range(STEPS)] for st in states[:4] if st.ok],
            **{f"server_{k}": v for k, v in delta.items()}}


def program_vs_calls(url: str, trials: int) -> dict:
    """Median latency of the 5-gen program as one /program request vs one /generate per gen."""
    ways = {"program": rf.Endpoint(url), "per_call": rf.Endpoint(url, use_program=False)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(trials + 1):  # trial 0 warms up
        for name, backend in ways.items():
            start = time.perf_counter()
            straight_line.run(topic=f"topic {i} ({name})", backend=backend, temperature=0)
            if i:
                times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"trials": trials, "program_s": med["program"], "per_call_s": med["per_call"],
            "ratio": med["per_call"] / med["program"], "times_s": times}


def chat_agent(client, question: str, latencies: list[float]) -> tuple[int, int]:
    """The same ReAct logic as plain chat calls; select becomes "name the tool" and a parse.
    Returns (tokens of the thought and input gens, tokens of the tool-naming calls)."""
    start, gen_tokens, select_tokens = time.perf_counter(), 0, 0
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Question: " + question}]

    def chat(extra: list[dict], max_tokens: int, stop: str | None) -> tuple[str, int]:
        r = client.chat.completions.create(model="baseline", messages=messages + extra,
                                           max_tokens=max_tokens, temperature=0, stop=stop)
        return r.choices[0].message.content or "", r.usage.completion_tokens

    for _ in range(STEPS):
        thought, n = chat([], GEN_TOKENS, "\n")
        thought = thought.removeprefix("Thought:").strip()
        gen_tokens += n
        said, n = chat([{"role": "assistant", "content": f"Thought: {thought}"},
                        {"role": "user", "content": "Which tool now: calculator, search or "
                                                    "finish? Answer with the tool name only."}],
                       4, None)
        select_tokens += n
        found = [(said.lower().find(a), a) for a in ACTIONS if a in said.lower()]
        action = min(found)[1] if found else "search"
        turn = f"Thought: {thought}\nAction: {action}"
        tool_input, n = chat([{"role": "assistant", "content": turn},
                              {"role": "user", "content": f"Give only the Input for {action}."}],
                             GEN_TOKENS, "\n")
        gen_tokens += n
        messages += [{"role": "assistant", "content": f"{turn}\nInput: {tool_input.strip()}"},
                     {"role": "user", "content": "Observation: " + run_tool(action, tool_input)}]
    latencies.append(time.perf_counter() - start)
    return gen_tokens, select_tokens


def run_hf_baseline(qs: list[str], threads: int, dtype: str) -> dict:
    from openai import OpenAI

    from radixflow.runtime.server.process import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open for the server's life)
        prefix="hf-baseline-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "bench.hf_baseline_server", "--port", str(port),
                             "--dtype", dtype], cwd=Path(__file__).parent.parent, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HF baseline server did not start; see {log.name}")
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
        chat_agent(client, "Warm up: what is 2 + 2?", [])
        latencies: list[float] = []
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            counts = list(pool.map(lambda q: chat_agent(client, q, latencies), qs))
        wall = time.perf_counter() - start
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    Path(log.name).unlink()
    return {**summary(wall, latencies, sum(c[0] for c in counts), len(qs)),
            "select_tokens": sum(c[1] for c in counts), "dtype": dtype}


def report(args: argparse.Namespace, raw: dict) -> str:
    on, off, hf, pc = raw["cache_on"], raw["cache_off"], raw["hf_baseline"], raw["program_vs_calls"]
    command = (f"python -m bench.agent --programs {args.programs} --threads {args.threads} "
               f"--trials {args.trials} --seed {args.seed}")
    setup = (f"Machine: {raw['machine']}; default model, {raw['dtype']}, radixflow on "
             f"{raw['device']}, the HF baseline on cpu. {args.programs} ReAct "
             f"programs, {args.threads} threads, greedy: a shared system prompt with three "
             f"few-shot examples ({raw['system_tokens']} tokens), {STEPS} steps each of a "
             f"thought gen (<= {GEN_TOKENS} tokens, stop at newline), a select among "
             f"{len(ACTIONS)} tools, a regex-constrained input gen (<= {GEN_TOKENS} tokens) and "
             "a Python tool. The baseline runs the same logic as OpenAI chat calls (3 per step; "
             "the model names the tool and the reply is parsed) against the naive HF server. "
             "Generated tokens count the thought and input gens on every row; the baseline's "
             f"tool-naming calls generated {hf['select_tokens']} more, not counted.")
    lines = [f"# Agent workload, {raw['date']}", "", f"Command: `{command}`", "", setup]
    if args.programs < 16:
        lines += ["", (f"NOTE: a smoke run ({args.programs} programs): the numbers are not a "
                       "measurement.")]
    lines += ["", ("| run | wall s | programs/s | gen tok/s | p50 latency s | p90 latency s | "
                   "cache hit rate | cache-on speed-up |"), "|---|---|---|---|---|---|---|---|"]
    for name, run in (("radixflow, radix cache on", on), ("radixflow, --disable-radix-cache", off),
                      ("HF baseline, chat calls", hf)):
        hit = f"{run['cache_hit_rate']:.1%}" if "cache_hit_rate" in run else "-"
        lines.append(f"| {name} | {run['wall_s']:.1f} | {run['programs_per_s']:.3f} | "
                     f"{run['gen_tok_per_s']:.1f} | {run['latency_p50_s']:.2f} | "
                     f"{run['latency_p90_s']:.2f} | {hit} | "
                     f"{on['programs_per_s'] / run['programs_per_s']:.2f}x |")
    targets = (f"Targets: >= 3x over cache-off (got "
               f"{on['programs_per_s'] / off['programs_per_s']:.2f}x), >= 10x over the HF "
               f"baseline (got {on['programs_per_s'] / hf['programs_per_s']:.2f}x).")
    straight = (f"/program vs per-call: a {STRAIGHT_GENS}-gen straight-line program "
                f"({STRAIGHT_TOKENS} tokens each), median of {pc['trials']} runs each way on the "
                f"cache-on server: /program {pc['program_s'] * 1e3:.0f} ms, one /generate per gen "
                f"{pc['per_call_s'] * 1e3:.0f} ms; per-call / program = {pc['ratio']:.2f}x.")
    return "\n".join([*lines, "", targets, "", straight]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--programs", type=int, default=32)
    ap.add_argument("--threads", type=int, default=32,
                    help="run_batch threads (32 = every program at once, "
                         "as num_threads=\"auto\" does)")
    ap.add_argument("--trials", type=int, default=10, help="runs of the /program comparison")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="markdown path (JSON beside it)")
    args = ap.parse_args()

    qs = questions(args.programs, args.seed)
    raw: dict = {"date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
                 "machine": f"{platform.machine()}, {os.cpu_count()} CPUs"}
    with rf.Runtime() as backend:
        raw["dtype"] = backend.model_info.get("dtype", "bfloat16")
        raw["device"] = backend.model_info.get("device", "cpu")
        raw["system_tokens"] = requests.post(backend.url + "/generate", json={
            "text": SYSTEM, "sampling_params": {"max_new_tokens": 0}}, timeout=60).json()[
            "meta_info"]["prompt_tokens"]
        raw["cache_on"] = run_radixflow(backend, qs, args.threads)
        print("cache on", json.dumps(raw["cache_on"]), flush=True)
        raw["program_vs_calls"] = program_vs_calls(backend.url, args.trials)
        print("program vs calls", json.dumps(raw["program_vs_calls"]), flush=True)
    with rf.Runtime(disable_radix_cache=True) as backend:
        raw["cache_off"] = run_radixflow(backend, qs, args.threads)
        print("cache off", json.dumps(raw["cache_off"]), flush=True)
    raw["hf_baseline"] = run_hf_baseline(qs, args.threads, raw["dtype"])
    print("hf baseline", json.dumps(raw["hf_baseline"]), flush=True)

    text = report(args, raw)
    smoke = "smoke" if args.programs < 16 else ""
    publish(text, args.out or Run("agent", run_key(raw["date"], smoke)), raw)


if __name__ == "__main__":
    main()
