"""Load generator for any OpenAI-compatible server: streaming chat requests from a seeded workload.

Per request: TTFT, TPOT, end-to-end latency, tokens (from the streamed usage), errors, and for
json_extract whether the output validates. Per run: throughput and percentiles, written as
JSON and a markdown summary.

    python -m bench.loadgen --workload shared_prefix --base-url http://127.0.0.1:30000
    python -m bench.loadgen --workload random_short --compare \\
        radixflow=http://127.0.0.1:30000 vllm=http://127.0.0.1:18090
        # the same requests against each server, one after another; ratio table + PNG chart

Caches persist on a running server: vary --seed (or restart it) for cold-cache figures.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from . import workloads as wl
from .report import fmt, raw_dir

DEFAULT_OUT = raw_dir("loadgen")  # a one-off run's files, out of git


@dataclass
class RequestResult:
    session: int
    turn: int
    ok: bool
    error: str | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float = 0.0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int = 0
    valid: bool | None = None  # None when the workload does not validate outputs
    problem: str | None = None
    output: str = ""


def normalize_base_url(url: str) -> str:
    url = url.rstrip("/")
    return url.removesuffix("/v1")


async def discover_model(client: httpx.AsyncClient, base_url: str) -> str:
    r = await client.get(f"{base_url}/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]["id"]


async def stream_chat(client: httpx.AsyncClient, base_url: str, payload: dict,
                      result: RequestResult) -> None:
    """Send one streaming chat request and fill `result` from its SSE events."""
    t0 = time.perf_counter()
    pieces: list[str] = []
    chunks = 0
    usage: dict | None = None
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions",
                                 json=payload) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = f"stream error: {event['error']}"
                    return
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if result.ttft_s is None:
                            result.ttft_s = time.perf_counter() - t0
                        pieces.append(content)
                        chunks += 1
    except (httpx.HTTPError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return
    finally:
        result.e2e_s = time.perf_counter() - t0
    result.output = "".join(pieces)
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens") or chunks
        details = usage.get("prompt_tokens_details") or {}
        result.cached_tokens = details.get("cached_tokens")
    else:  # a server without include_usage: one content chunk is about one token
        result.completion_tokens = chunks
    if result.ttft_s is not None and result.completion_tokens > 1:
        result.tpot_s = (result.e2e_s - result.ttft_s) / (result.completion_tokens - 1)
    result.ok = result.completion_tokens > 0
    if not result.ok:
        result.error = "empty output"


def make_payload(model: str, messages: list[dict], turn: wl.Turn) -> dict:
    payload: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": turn.max_tokens, "stream": True,
        "stream_options": {"include_usage": True}, "temperature": 0.0,
    }
    if turn.ignore_eos:
        payload["ignore_eos"] = True
    if turn.response_format is not None:
        payload["response_format"] = turn.response_format
    return payload


async def run_session(client: httpx.AsyncClient, base_url: str, model: str, index: int,
                      session: wl.Session) -> list[RequestResult]:
    messages: list[dict] = []
    if session.system is not None:
        messages.append({"role": "system", "content": session.system})
    results = []
    for t, turn in enumerate(session.turns):
        messages.append({"role": "user", "content": turn.user})
        result = RequestResult(session=index, turn=t, ok=False)
        await stream_chat(client, base_url, make_payload(model, messages, turn), result)
        results.append(result)
        if not result.ok:
            break  # the rest of the conversation cannot be sent without this reply
        if session.validate is not None:
            result.problem = session.validate(result.output)
            result.valid = result.problem is None
        messages.append({"role": "assistant", "content": result.output})
    return results


async def run_workload(base_url: str, workload: wl.Workload, *, model: str | None = None,
                       api_key: str | None = None, warmup: int = 1,
                       timeout: float = 1800.0) -> dict:
    """Run every session of `workload` (at most `concurrency` at once); the run's record."""
    base_url = normalize_base_url(base_url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=workload.concurrency + 2)
    async with httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits) as client:
        model = model or await discover_model(client, base_url)
        for _ in range(warmup):
            await stream_chat(client, base_url, make_payload(
                model, [{"role": "user", "content": "Hello"}], wl.Turn("Hello", 4)),
                RequestResult(session=-1, turn=0, ok=False))
        gate = asyncio.Semaphore(workload.concurrency)

        async def gated(i: int, s: wl.Session) -> list[RequestResult]:
            async with gate:
                return await run_session(client, base_url, model, i, s)

        t0 = time.perf_counter()
        per_session = await asyncio.gather(*(gated(i, s) for i, s in
                                             enumerate(workload.sessions)))
        wall = time.perf_counter() - t0
    results = [r for rs in per_session for r in rs]
    expected = workload.num_requests
    return {
        "workload": workload.name, "base_url": base_url, "model": model,
        "config": {"sessions": len(workload.sessions), "requests": expected,
                   "concurrency": workload.concurrency, **workload.meta},
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "summary": summarize(results, wall, expected),
        "requests": [dataclasses.asdict(r) | {"output": r.output[:300]} for r in results],
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(results: list[RequestResult], wall: float, expected: int) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens for r in ok)
    prompt = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    validated = [r for r in ok if r.valid is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    e2e = [r.e2e_s for r in ok]

    def ms(x: float | None) -> float | None:
        return None if x is None else round(1000 * x, 2)

    return {
        "requests": expected, "completed": len(ok), "errors": expected - len(ok),
        "error_examples": [r.error for r in results if not r.ok][:5],
        "wall_s": round(wall, 3),
        "output_tok_s": round(out_tokens / wall, 2) if wall > 0 else None,
        "total_tok_s": round((out_tokens + sum(prompt)) / wall, 2) if wall > 0 else None,
        "req_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "output_tokens": out_tokens, "prompt_tokens": sum(prompt) if prompt else None,
        "cached_tokens": sum(cached) if cached else None,
        "cache_hit_rate": round(sum(cached) / sum(prompt), 4) if cached and sum(prompt) else None,
        "ttft_ms_p50": ms(percentile(ttft, 50)), "ttft_ms_p90": ms(percentile(ttft, 90)),
        "ttft_ms_p99": ms(percentile(ttft, 99)),
        "tpot_ms_p50": ms(percentile(tpot, 50)), "tpot_ms_p90": ms(percentile(tpot, 90)),
        "e2e_s_p50": percentile(e2e, 50), "e2e_s_p90": percentile(e2e, 90),
        "valid_pct": (round(100 * sum(r.valid for r in validated) / len(validated), 1)
                      if validated else None),
    }


SUMMARY_ROWS = [
    ("output tok/s", "output_tok_s"), ("requests/s", "req_s"), ("TTFT p50 (ms)", "ttft_ms_p50"),
    ("TTFT p90 (ms)", "ttft_ms_p90"), ("TTFT p99 (ms)", "ttft_ms_p99"),
    ("TPOT p50 (ms)", "tpot_ms_p50"),
    ("TPOT p90 (ms)", "tpot_ms_p90"), ("e2e p50 (s)", "e2e_s_p50"), ("e2e p90 (s)", "e2e_s_p90"),
    ("cache hit rate", "cache_hit_rate"), ("valid %", "valid_pct"), ("errors", "errors"),
    ("wall (s)", "wall_s"),
]


def markdown(run: dict, name: str) -> str:
    cfg, s = run["config"], run["summary"]
    about = (f"{run['base_url']}, model `{run['model']}`, {cfg['requests']} requests "
             f"({cfg['sessions']} sessions), concurrency {cfg['concurrency']}, "
             f"seed {cfg['seed']}, scale {cfg['scale']}; {run['time']}")
    lines = [f"# {run['workload']} on {name}", "", about, "", "| metric | value |", "|---|---|"]
    lines += [f"| {label} | {fmt(s[key])} |" for label, key in SUMMARY_ROWS]
    if s["error_examples"]:
        lines += ["", "Errors (first few):", *[f"- {e}" for e in s["error_examples"]]]
    return "\n".join(lines) + "\n"


def write_run(run: dict, name: str, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{run['workload']}-{name}-{run['time'].replace(':', '')}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({"name": name, **run}, indent=1) + "\n")
    md_path.write_text(markdown(run, name))
    return json_path, md_path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=list(wl.WORKLOADS))
    p.add_argument("--base-url", help="server URL (with or without /v1)")
    p.add_argument("--name", default=None, help="label of the server in the results")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--compare", nargs="+", metavar="NAME=URL",
                   help="run against several servers one after another; ratios vs the first")
    p.add_argument("--num-requests", type=int, default=None,
                   help="sessions to run (conversations for multi_turn)")
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=float, default=1.0, help="shrink prompts (smoke tests)")
    p.add_argument("--max-tokens", type=int, default=None, help="override output lengths")
    p.add_argument("--warmup", type=int, default=1, help="short requests before measuring")
    p.add_argument("--api-key", default=None)
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if bool(args.base_url) == bool(args.compare):
        p.error("give exactly one of --base-url and --compare")
    if args.compare and any("=" not in c for c in args.compare):
        p.error("--compare takes NAME=URL pairs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    targets = ([c.split("=", 1) for c in args.compare] if args.compare
               else [(args.name or "server", args.base_url)])
    runs: dict[str, dict] = {}
    for name, url in targets:
        workload = wl.build(args.workload, num_sessions=args.num_requests,
                            concurrency=args.concurrency, seed=args.seed, scale=args.scale,
                            max_tokens=args.max_tokens)
        print(f"{args.workload}: {workload.num_requests} requests to {name} ({url}) ...",
              file=sys.stderr, flush=True)
        run = asyncio.run(run_workload(url, workload, model=None if args.compare else args.model,
                                       api_key=args.api_key, warmup=args.warmup))
        json_path, _ = write_run(run, name, args.out_dir)
        print(markdown(run, name))
        print(f"wrote {json_path}", file=sys.stderr)
        runs[name] = run
    if args.compare:
        from .compare import write_comparison

        table, paths = write_comparison(runs, args.out_dir)
        print(table)
        print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0 if all(r["summary"]["errors"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
