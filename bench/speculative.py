"""Speculative decoding (n-gram / prompt lookup): radixflow with and without it, and llama.cpp
with and without its own n-gram speculation, on the same greedy chat requests.

    python -m bench.speculative --llama-server /tmp/anchor-llamacpp/build/bin/llama-server

Workloads (seeded): copy_extract (documents holding the values, a JSON Schema response:
copy-heavy), summarise_quote (a summary that quotes sentences verbatim), random_short (random
words: little to copy), predicted (copy a text out; the request's `prediction`, OpenAI's
Predicted Outputs, holds the output a plain run gave, as an editing client sends the text it
expects: radixflow only, llama.cpp has no such field). For each: single-stream TPOT per
request, radixflow's off and on alternating per request on one server (the request's
`speculative` field: off, on, on, off, ...), outputs compared token for token; acceptance from
/metrics; 8-concurrent throughput (rounds of off, on, on, off: --throughput-rounds); llama.cpp
plain and with `--spec-type ngram-simple`, one server at a time (plain, spec, spec, plain).
Then the verify pass's cost per drafted token, in-process: one request's decode pass with
1 + k rows at a 512-token context.
Filed as a section of bench/results/speculative.md.

At model scale: `--model <a .gguf>` serves that file instead of the default model (to
radixflow and llama.cpp both), e.g. peers/scale-models.sh's random-weight Llama-3.2-1B Q4_K_M:
its text is gibberish, so only `predicted` (and the verify pass's cost) says anything there.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from . import workloads as wl
from .peers import serving
from .report import Run, publish, run_key
from .serve import metric

RF_URL, LLAMA_URL = "http://127.0.0.1:18090", "http://127.0.0.1:18091"
FIRSTS = ["Maria", "Kenji", "Oluwaseun", "Ingrid", "Rafael", "Priya", "Tomasz", "Aiyana"]
LASTS = ["Delgado-Fernandez", "Nakamura", "Adeyemi", "Johansson", "Okonkwo", "Kowalczyk"]
COMPANIES = ["Northwind Traders", "Contoso Pharmaceuticals", "Fabrikam Robotics",
             "Tailspin Toys", "Wide World Importers", "Litware Systems"]
STREETS = ["Harbor Boulevard", "Maple Avenue", "Rue de Rivoli", "Kurfurstendamm", "King Street"]
SCHEMA = {"type": "object", "properties": {
    k: {"type": "string"} for k in ("invoice_number", "vendor", "customer", "contact", "email",
                                    "phone", "address", "total", "po_number")},
    "required": ["invoice_number", "vendor", "customer", "contact", "email", "phone", "address",
                 "total", "po_number"], "additionalProperties": False}


def copy_extract(n: int, rng: random.Random) -> list[dict]:
    out = []
    for _ in range(n):
        first, last = rng.choice(FIRSTS), rng.choice(LASTS)
        vendor, customer = rng.sample(COMPANIES, 2)
        doc = (f"Invoice {rng.randint(1000, 9999)}-{rng.choice('ABCDEFGH')} from {vendor}, "
               f"billed to {customer} at {rng.randint(10, 9999)} {rng.choice(STREETS)}, "
               f"Suite {rng.randint(100, 999)}. Contact: {first} {last}, phone "
               f"+1 ({rng.randint(200, 999)}) 555-{rng.randint(1000, 9999)}, email "
               f"{first.lower()}.{last.lower()}@{customer.split()[0].lower()}.example. Total "
               f"due: ${rng.randint(100, 99999)}.{rng.randint(10, 99)}, purchase order "
               f"PO-{rng.randint(10000, 99999)}-{rng.choice(['XZ', 'QK', 'LM'])}. "
               + wl.words(rng, 40))
        out.append({"messages": [{"role": "user", "content":
                    "Extract the invoice's fields as JSON. Copy every value exactly as it is "
                    "written in the document.\n\n" + doc}],
                    "max_tokens": 200, "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "invoice", "schema": SCHEMA, "strict": True}}})
    return out


def summarise_quote(n: int, rng: random.Random) -> list[dict]:
    out = []
    for _ in range(n):
        sentences = [wl._sentences(rng, 30) for _ in range(5)]
        text = " ".join(sentences)
        out.append({"messages": [{"role": "user", "content":
                    "Summarise the text below in one sentence, then quote its first and its "
                    f"last sentence word for word.\n\n{text}"}], "max_tokens": 160})
    return out


def random_short(n: int, rng: random.Random) -> list[dict]:
    sessions = wl.random_short(n, rng.randint(0, 10**6))
    return [{"messages": [{"role": "user", "content": s.turns[0].user}], "max_tokens": 64,
             "ignore_eos": True} for s in sessions]


def predicted(n: int, rng: random.Random) -> list[dict]:
    """Copy a text out; radixflow() gives each request its `prediction` (the plain output)."""
    out = []
    for _ in range(n):
        text = " ".join(wl._sentences(rng, 30) for _ in range(3))
        out.append({"messages": [{"role": "user", "content":
                    f"Repeat the text below exactly, word for word.\n\n{text}"}],
                    "max_tokens": 96, "ignore_eos": True})
    return out


WORKLOADS = {"copy_extract": copy_extract, "summarise_quote": summarise_quote,
             "random_short": random_short, "predicted": predicted}
PREDICTED = {"predicted"}  # the workloads whose requests carry a prediction (radixflow only)


@functools.cache
def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def chat(url: str, req: dict, extra: dict | None = None) -> dict:
    """One streamed greedy chat request: its text, tokens, TTFT and TPOT."""
    body = {"model": model_id(url), "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **req, **(extra or {})}
    t0, first, pieces, usage, timings = time.perf_counter(), None, [], {}, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings  # llama.cpp's (draft_n, ...)
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    first = first or time.perf_counter()
                    pieces.append(choice["delta"]["content"])
    end = time.perf_counter()
    tokens = usage.get("completion_tokens", len(pieces))
    tpot = (end - first) / (tokens - 1) if first and tokens > 1 else None
    return {"text": "".join(pieces), "tokens": tokens, "ttft": (first or end) - t0,
            "tpot": tpot, "drafted": timings.get("draft_n", 0),
            "accepted": timings.get("draft_n_accepted", 0)}


def throughput(url: str, reqs: list[dict], extra: dict | None, concurrency: int) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda r: chat(url, r, extra), reqs))
    return sum(o["tokens"] for o in outs) / (time.perf_counter() - t0)


def spec_counts(url: str) -> tuple[float, float, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return tuple(metric(text, f"radixflow:spec_{n}_total")
                 for n in ("verify_passes", "draft_tokens", "accepted_tokens"))


def median(values: list[float]) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


# ---- radixflow: one server, the request's field switches it ----

def plain(req: dict) -> dict:
    """The request without its prediction (which would turn speculation on)."""
    return {k: v for k, v in req.items() if k != "prediction"}


def radixflow(args, sets: dict[str, list[dict]]) -> dict:
    cmd = ["radixflow", "serve", "--port", RF_URL.rsplit(":", 1)[1], "--log-level", "warning",
           "--speculative-algorithm", "ngram",
           "--speculative-num-draft-tokens", str(args.draft_tokens),
           "--speculative-prediction-draft-tokens", str(args.prediction_draft_tokens),
           "--speculative-ngram-min-match-window-size", str(args.ngram_min_window),
           *(["--model", str(args.model)] if args.model else [])]
    res = {}
    with serving(cmd, RF_URL):
        model_id.cache_clear()
        for name, reqs in sets.items():
            chat(RF_URL, reqs[0], {"speculative": False})  # warm (the grammar's first compile)
            if name in PREDICTED:  # the text a plain run gives, as the client's prediction
                reqs = [{**r, "prediction": {"type": "content", "content": chat(
                    RF_URL, r, {"speculative": False})["text"]}} for r in reqs]
            off, on, same = [], [], 0
            before = spec_counts(RF_URL)
            for i, req in enumerate(reqs):
                if name not in PREDICTED:  # its prompt cached, as for both runs below (a
                    # prefill from the cache can round differently from a cold one)
                    chat(RF_URL, {**plain(req), "max_tokens": 1}, {"speculative": False})
                order = [False, True] if i % 2 == 0 else [True, False]
                got = {flag: chat(RF_URL, plain(req) if not flag else req,
                                  {"speculative": flag}) for flag in order}
                off.append(got[False])
                on.append(got[True])
                same += got[False]["text"] == got[True]["text"]
            passes, drafted, accepted = (a - b for a, b in zip(spec_counts(RF_URL), before))
            tput = {False: [], True: []}
            for flag in (False, True, True, False) * args.throughput_rounds:
                tput[flag].append(throughput(RF_URL, reqs if flag else list(map(plain, reqs)),
                                             {"speculative": flag}, args.concurrency))
            res[name] = {
                "tpot_off": median([o["tpot"] for o in off]),
                "tpot_on": median([o["tpot"] for o in on]),
                "same": same, "n": len(reqs), "passes": passes, "drafted": drafted,
                "accepted": accepted, "tput_off": median(tput[False]),
                "tput_on": median(tput[True]),
                "tokens": median([o["tokens"] for o in on])}
    return res


# ---- llama.cpp: one server at a time, plain and with its n-gram speculation ----

@contextlib.contextmanager
def llama(args, gguf: Path, spec: bool) -> Iterator[str]:
    cmd = [str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port",
           LLAMA_URL.rsplit(":", 1)[1], "--threads", str(args.threads), "--threads-batch",
           str(args.threads), "--parallel", str(args.concurrency), "--ctx-size",
           str(4096 * args.concurrency), "--cont-batching"]
    if spec:
        cmd += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n",
                str(args.llama_ngram_n), "--spec-ngram-simple-size-m", str(args.llama_draft_m)]
    with serving(cmd, LLAMA_URL) as url:
        model_id.cache_clear()
        yield url


def llama_cpp(args, sets: dict[str, list[dict]], gguf: Path) -> dict:
    sets = {name: reqs for name, reqs in sets.items() if name not in PREDICTED}
    runs: dict[str, dict[bool, list]] = {n: {False: [], True: []} for n in sets}
    for spec in (False, True, True, False):
        with llama(args, gguf, spec) as url:
            for name, reqs in sets.items():
                chat(url, reqs[0])  # warm
                outs = [chat(url, r) for r in reqs]
                tput = throughput(url, reqs, None, args.concurrency)
                runs[name][spec].append((outs, tput))
    res = {}
    for name, by in runs.items():
        row = {}
        for spec, label in ((False, "off"), (True, "on")):
            row[f"tpot_{label}"] = median([median([o["tpot"] for o in outs])
                                           for outs, _ in by[spec]])
            row[f"tput_{label}"] = median([t for _, t in by[spec]])
        row["same"] = sum(a["text"] == b["text"]
                          for a, b in zip(by[False][0][0], by[True][0][0]))
        spec_outs = [o for outs, _ in by[True] for o in outs]
        row["drafted"] = sum(o["drafted"] for o in spec_outs)
        row["accepted"] = sum(o["accepted"] for o in spec_outs)
        res[name] = row
    return res


# ---- the verify pass's cost per drafted token ----

def verify_cost(context: int = 512, repeats: int = 30, model: str | None = None
                ) -> dict[str, dict[int, float]]:
    """ms per decode pass of 1 and of 8 requests (512-token contexts) with k drafted rows
    each, k = 0, 1, 2, 3, 4, 8, 16 (8 requests: up to 4); `model`: a .gguf or folder (None:
    the default model)."""
    import torch

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

    times: dict[str, dict] = {"1": {}, "8": {}}
    with Engine(model, max_total_tokens=8 * (context + 17) + 64) as eng:
        runner = eng.scheduler.runner
        pool, table = runner.kv_pool, runner.req_to_token_pool.req_to_token
        rows = [runner.req_to_token_pool.alloc() for _ in range(8)]
        slots = [pool.alloc(context + 17) for _ in rows]
        for row, s in zip(rows, slots):
            table[row, :context + 17] = s.to(torch.int32)
        for batch, drafts in (("1", (0, 1, 2, 3, 4, 8, 16)), ("8", (0, 1, 2, 4))):
            for k in drafts:
                chosen = rows[:int(batch)]
                parts = [BatchRequest(row, [100 + i], context + i, [0])
                         for row in chosen for i in range(k + 1)]
                out = torch.cat([s[context:context + k + 1] for s in slots[:int(batch)]])
                samples = []
                step = runner.cpu_decode.step if runner.cpu_decode is not None else None
                if step is not None and batch == "1" and k in (0, 4):
                    step.profile(True, cpu_time=True)
                for _ in range(repeats):
                    t = time.perf_counter()
                    runner.forward(ForwardMode.DECODE, parts, out)
                    samples.append(time.perf_counter() - t)
                times[batch][k] = statistics.median(samples) * 1000
                if step is not None and batch == "1" and k in (0, 4):
                    phases = step.profile(False)
                    times[f"phases k={k}"] = {name: round(sec / repeats * 1000, 3)
                                              for name, sec in phases.items() if sec}
        for row, s in zip(rows, slots):
            pool.free(s)
            runner.req_to_token_pool.free(row)
    return times


def report(args, rf: dict, lc: dict | None, cost: dict[int, float], level: str) -> str:
    lines = [f"## Speculative decoding, n-gram ({datetime.date.today()}, {level})", "",
             f"`{args.command}`; "
             + (f"`{Path(args.model).name}`" if args.model else
                "SmolLM2-135M-Instruct (radixflow: its default model"
                + ("; llama.cpp: the same Q4_1 GGUF)" if lc else ")"))
             + ", greedy, 2 threads, "
             f"{args.requests} requests a workload, {args.concurrency} at a time for tok/s. "
             "radixflow: `--speculative-algorithm ngram --speculative-num-draft-tokens "
             f"{args.draft_tokens} --speculative-prediction-draft-tokens "
             f"{args.prediction_draft_tokens}`, off/on per request"
             + ("; llama.cpp: `--spec-type ngram-simple --spec-ngram-simple-size-n "
                f"{args.llama_ngram_n} --spec-ngram-simple-size-m {args.llama_draft_m}`."
                if lc else "."), "",
             "| workload | rf TPOT off / on (ms) | speedup | identical | accepted / drafted "
             "| tokens per verify | rf 8-conc tok/s off / on |"
             + (" llama.cpp TPOT off / on | speedup | identical | accepted / drafted | "
                "llama.cpp 8-conc off / on |" if lc else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|---|---|---|" if lc else "")]
    for name, r in rf.items():
        rate = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
        per = 1 + r["accepted"] / r["passes"] if r["passes"] else 1.0
        row = (f"| {name} | {r['tpot_off'] * 1e3:.1f} / {r['tpot_on'] * 1e3:.1f} | "
               f"{r['tpot_off'] / r['tpot_on']:.2f}x | {r['same']}/{r['n']} | "
               f"{rate:.0%} ({r['accepted']:.0f}/{r['drafted']:.0f}) | {per:.2f} | "
               f"{r['tput_off']:.0f} / {r['tput_on']:.0f} |")
        if lc and name not in lc:
            row += " - | - | - | - | - |"
        elif lc:
            c = lc[name]
            lrate = c["accepted"] / c["drafted"] if c["drafted"] else 0.0
            row += (f" {c['tpot_off'] * 1e3:.1f} / {c['tpot_on'] * 1e3:.1f} | "
                    f"{c['tpot_off'] / c['tpot_on']:.2f}x | {c['same']}/{r['n']} | "
                    f"{lrate:.0%} ({c['accepted']}/{c['drafted']}) | "
                    f"{c['tput_off']:.0f} / {c['tput_on']:.0f} |")
        lines.append(row)
    lines += ["", "The verify pass (512-token contexts, the C decode step, in-process): ms "
              "per pass with k drafted rows per request, and each drafted token's cost as a "
              "share of the pass without drafts:", ""]
    for batch in ("1", "8"):
        by_k = cost[batch]
        base = by_k[0]
        lines += [f"| {batch} request(s), k = | " + " | ".join(str(k) for k in by_k) + " |",
                  "|---|" + "---|" * len(by_k),
                  "| ms | " + " | ".join(f"{v:.2f}" for v in by_k.values()) + " |",
                  "| per drafted token | - | " + " | ".join(
                      f"{(v - base) / (k * int(batch)) / base:.1%}"
                      for k, v in by_k.items() if k) + " |", ""]
    phases = [cost.get("phases k=0"), cost.get("phases k=4")]
    if all(phases):
        lines += ["Where one request's pass goes (ms of thread 0's CPU time per pass; the C "
                  "step's phase timers), without drafts and with 4:", "",
                  "| phase | k = 0 | k = 4 |", "|---|---|---|"]
        lines += [f"| {name} | {phases[0].get(name, 0):.2f} | {phases[1].get(name, 0):.2f} |"
                  for name in phases[1]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--llama-server", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=None,
                    help="a .gguf both engines serve (default: radixflow's default model)")
    ap.add_argument("--verify-repeats", type=int, default=30,
                    help="decode passes timed per cell of the verify-cost table")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--prediction-draft-tokens", type=int, default=16)
    ap.add_argument("--throughput-rounds", type=int, default=1,
                    help="radixflow's concurrent throughput runs: this many rounds of (off, on, "
                    "on, off), medians (a round of --requests 4 varies by +-15%% run to run)")
    ap.add_argument("--ngram-min-window", type=int, default=2,
                    help="radixflow's --speculative-ngram-min-match-window-size")
    ap.add_argument("--llama-ngram-n", type=int, default=3)
    ap.add_argument("--llama-draft-m", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--verify-cost-only", action="store_true",
                    help="print the verify pass's cost and stop (no servers)")
    args = ap.parse_args(argv)
    args.command = "python -m bench.speculative " + " ".join(argv or __import__("sys").argv[1:])
    from radixflow.kernels.cpu.features import cpu_features

    level = cpu_features().level
    model = str(args.model) if args.model else None
    if args.verify_cost_only:
        print(json.dumps(verify_cost(repeats=args.verify_repeats, model=model), indent=1))
        return
    rng = random.Random(args.seed)
    sets = {name: WORKLOADS[name](args.requests, rng) for name in args.workloads}
    rf = radixflow(args, sets)
    lc = None
    if args.llama_server is not None:
        from radixflow.runtime.model_loader.default_model import fetch_default_gguf

        with tempfile.TemporaryDirectory() as tmp:
            lc = llama_cpp(args, sets, args.model or fetch_default_gguf(Path(tmp)))
    cost = verify_cost(repeats=args.verify_repeats, model=model)
    key = run_key(str(datetime.date.today()), level, *([args.label] if args.label else []))
    publish(report(args, rf, lc, cost, level), Run("speculative", key),
            raw={"radixflow": rf, "llama_cpp": lc, "verify_ms": cost})


if __name__ == "__main__":
    main()
