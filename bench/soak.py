"""Soak: a server under moderate, mixed and partly hostile load for an hour; its memory must stay
flat.

A fresh `radixflow serve` (default model unless --model) takes, from --concurrency client
loops, a mix of what real clients send: streamed chats, /generate calls, json_schema chats,
clients that hang up mid-stream, refused requests (a bad schema, an oversized body, a
text/plain body) and session turns (open, continue, close). Every --sample-s seconds it records
the resident memory of the server's whole process tree (HTTP + scheduler + detokenizer), the
KV tokens in use, requests done and failed, and how long /health takes to answer. The report
gives RSS at the start and end of the second half, its slope over the second half (after
warm-up), and a plot.

    python -m bench.soak                          # 60 minutes -> bench/results/soak.md
    python -m bench.soak --minutes 2 --no-write   # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import statistics
import time
from pathlib import Path

import httpx

from .report import Run, fmt, publish, run_key

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of pid and every process below it (Linux /proc)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


class Load:
    """The client loops: each picks a kind of request at random and sends it."""

    def __init__(self, url: str, model: str, seed: int):
        self.url = url
        self.model = model
        self.rng = random.Random(seed)
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self.unexpected: list[str] = []

    def _count(self, table: dict[str, int], kind: str) -> None:
        table[kind] = table.get(kind, 0) + 1

    async def loop(self, client: httpx.AsyncClient, stop_at: float) -> None:
        kinds = [self.chat_stream, self.generate, self.json_chat, self.hang_up, self.refused,
                 self.session_turns]
        weights = [4, 3, 2, 1, 1, 1]
        while time.monotonic() < stop_at:
            kind = self.rng.choices(kinds, weights)[0]
            try:
                await kind(client)
                self._count(self.done, kind.__name__)
            except Exception as exc:  # noqa: BLE001 -- counted and reported, the soak goes on
                self._count(self.failed, kind.__name__)
                if len(self.unexpected) < 20:
                    self.unexpected.append(f"{kind.__name__}: {type(exc).__name__}: {exc}")

    def _prompt(self) -> str:
        topic = self.rng.choice(["the sea", "a city", "tea", "rain", "a robot", "history"])
        return f"Write two sentences about {topic} (variant {self.rng.randrange(10_000)})."

    async def chat_stream(self, client: httpx.AsyncClient) -> None:
        body = {"model": self.model, "stream": True, "max_tokens": self.rng.randint(8, 48),
                "messages": [{"role": "user", "content": self._prompt()}]}
        async with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for _ in r.aiter_lines():
                pass

    async def generate(self, client: httpx.AsyncClient) -> None:
        body = {"text": self._prompt(), "sampling_params": {"max_new_tokens": 24}}
        r = await client.post(f"{self.url}/generate", json=body)
        r.raise_for_status()

    async def json_chat(self, client: httpx.AsyncClient) -> None:
        body = {"model": self.model, "max_tokens": 48,
                "messages": [{"role": "user", "content": "A person as JSON: " + self._prompt()}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "p", "schema": SCHEMA}}}
        r = await client.post(f"{self.url}/v1/chat/completions", json=body)
        r.raise_for_status()

    async def hang_up(self, client: httpx.AsyncClient) -> None:
        body = {"text": self._prompt(), "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        async with client.stream("POST", f"{self.url}/generate", json=body) as r:
            r.raise_for_status()
            seen = 0
            async for _ in r.aiter_lines():
                seen += 1
                if seen > 6:
                    break  # leaving the block closes the connection mid-stream

    async def refused(self, client: httpx.AsyncClient) -> None:
        which = self.rng.randrange(3)
        if which == 0:
            body = {"text": "x", "sampling_params": {"json_schema": '{"type": "nope"}'}}
            r = await client.post(f"{self.url}/generate", json=body)
        elif which == 1:
            r = await client.post(f"{self.url}/generate", content=b"{}",
                                  headers={"Content-Type": "text/plain"})
        else:
            r = await client.post(f"{self.url}/generate", content=b"x" * (9 << 20),
                                  headers={"Content-Type": "application/json"})
        if not 400 <= r.status_code < 500:
            raise RuntimeError(f"expected a 4xx, got {r.status_code}: {r.text[:200]}")

    async def session_turns(self, client: httpx.AsyncClient) -> None:
        r = await client.post(f"{self.url}/open_session", json={"capacity_of_str_len": 2048})
        r.raise_for_status()
        sid = r.json()
        rid = None
        for _ in range(3):
            params = {"id": sid, **({"rid": rid} if rid else {})}
            r = await client.post(f"{self.url}/generate", json={
                "text": " " + self._prompt(), "session_params": params,
                "sampling_params": {"max_new_tokens": 12}})
            r.raise_for_status()
            rid = r.json()["meta_info"]["id"]
        r = await client.post(f"{self.url}/close_session", json={"session_id": sid})
        r.raise_for_status()


async def sample(client: httpx.AsyncClient, url: str, pid: int, load: Load, t0: float) -> dict:
    start = time.perf_counter()
    health = await client.get(f"{url}/health")
    health_s = time.perf_counter() - start
    info = (await client.get(f"{url}/get_server_info")).json()
    return {"t_s": time.monotonic() - t0, "rss_bytes": tree_rss_bytes(pid),
            "health_status": health.status_code, "health_s": health_s,
            "kv_used_tokens": info.get("kv_used_tokens"),
            "done": sum(load.done.values()), "failed": sum(load.failed.values())}


async def soak(url: str, pid: int, minutes: float, concurrency: int, sample_s: float,
               seed: int) -> tuple[list[dict], Load]:
    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    load = Load(url, model, seed)
    t0 = time.monotonic()
    stop_at = t0 + minutes * 60
    samples: list[dict] = []
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client, \
            httpx.AsyncClient(timeout=30) as probe:
        loops = [asyncio.create_task(load.loop(client, stop_at)) for _ in range(concurrency)]
        while time.monotonic() < stop_at:
            samples.append(await sample(probe, url, pid, load, t0))
            print(json.dumps(samples[-1]), flush=True)
            await asyncio.sleep(sample_s)
        await asyncio.gather(*loops)
        samples.append(await sample(probe, url, pid, load, t0))
    return samples, load


def slope_mb_per_hour(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var * 3600 / 2**20


def cpu_level() -> str:
    from radixflow.kernels.cpu.features import cpu_features

    return cpu_features().describe()


def report(samples: list[dict], load: Load, args: argparse.Namespace, cmd: str) -> str:
    half = [s for s in samples if s["t_s"] >= samples[-1]["t_s"] / 2]
    rss = [s["rss_bytes"] / 2**20 for s in samples]
    health = [s["health_s"] for s in samples]
    slope = slope_mb_per_hour([(s["t_s"], s["rss_bytes"]) for s in half])
    lines = [
        f"# Soak: {args.minutes:g} minutes of mixed load ({datetime.date.today()})",
        "",
        f"`{cmd}`; CPU level {cpu_level()}, {os.cpu_count()} cores; model "
        f"{args.model or 'default (SmolLM2-135M-Instruct)'}; {args.concurrency} client loops.",
        "",
        "| RSS of the server's process tree | MiB |",
        "|---|---|",
        f"| first sample | {fmt(rss[0])} |",
        f"| start of the second half | {fmt(half[0]['rss_bytes'] / 2**20)} |",
        f"| end | {fmt(rss[-1])} |",
        f"| max | {fmt(max(rss))} |",
        f"| slope over the second half (MiB/hour) | {fmt(slope)} |",
        "",
        f"/health: median {fmt(statistics.median(health) * 1000)} ms, max "
        f"{fmt(max(health) * 1000)} ms, non-200 answers "
        f"{sum(s['health_status'] != 200 for s in samples)} of {len(samples)}.",
        "",
        "| request kind | done | failed |",
        "|---|---|---|",
        *[f"| {kind} | {load.done.get(kind, 0)} | {load.failed.get(kind, 0)} |"
          for kind in sorted(set(load.done) | set(load.failed))],
        "",
    ]
    if load.unexpected:
        lines += ["Failures (first 20):", "", *[f"- {u}" for u in load.unexpected], ""]
    return "\n".join(lines)


def plot(samples: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot([s["t_s"] / 60 for s in samples], [s["rss_bytes"] / 2**20 for s in samples])
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS of the process tree (MiB)")
    ax.set_ylim(0, max(s["rss_bytes"] for s in samples) / 2**20 * 1.15)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--sample-s", type=float, default=15.0)
    ap.add_argument("--model", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--variant", default="",
                    help="what sets this run apart, after the date in its section's key "
                         "(\"hour\": the section 2026-12-02-hour of bench/results/soak.md)")
    args = ap.parse_args()
    from radixflow.runtime.server.process import ServerProcess

    with ServerProcess(args.model, log_level="warning", start_timeout=600) as server:
        samples, load = asyncio.run(soak(server.url, server.proc.pid, args.minutes,
                                         args.concurrency, args.sample_s, args.seed))
    cmd = "python -m bench.soak " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if v not in (None, False, "") and k not in ("no_write", "variant"))
    text = report(samples, load, args, cmd)
    out = None if args.no_write else Run("soak", run_key(str(datetime.date.today()),
                                                         args.variant))
    if out is not None and plot(samples, out.chart):
        text += f"\n![RSS over time]({out.chart.name})\n"
    publish(text, out, {"samples": samples, "done": load.done, "failed": load.failed})


if __name__ == "__main__":
    main()
