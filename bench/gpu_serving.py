"""bench/gpu_check.py's serving parts: an Engine generate on the default model, decode tok/s
at batch 1 / 16 / 64 (and the Triton kernels compiled after start-up), and a served
json_schema chat through `radixflow serve`."""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.gpu_report import Section
from bench.gpu_setup import REPO, STAGE

# KV pools that leave the GPU to the server started after the engine (and start fast on a CPU)
KV_TOKENS = {"cuda": 262144, "cpu": 16384}
PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "List three prime numbers:"]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def compiled_kernels() -> collections.Counter:
    """Kernels in this run's triton cache (TRITON_CACHE_DIR), by name."""
    folder = Path(os.environ.get("TRITON_CACHE_DIR", "/nonexistent"))
    return collections.Counter(p.stem for p in folder.glob("*/*.json")
                               if not p.name.startswith("__grp__"))


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def engine_sections(device, dry_run: bool) -> list[Section]:
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.model_loader import resolve_model

    started = time.perf_counter()
    folder = resolve_model(None)
    resolved = time.perf_counter() - started
    log = _Lines()
    attn_logger = logging.getLogger("radixflow.runtime.attention.triton_backend")
    attn_logger.addHandler(log)
    attn_logger.setLevel(logging.INFO)
    started = time.perf_counter()
    engine = Engine(str(folder), device=device.type, max_total_tokens=KV_TOKENS[device.type])
    start_s = time.perf_counter() - started
    attn_logger.removeHandler(log)
    at_start = compiled_kernels()
    try:
        generate = _generate(engine, dry_run)
        decode = _decode_rates(engine, dry_run)
    finally:
        engine.shutdown()
    later = compiled_kernels() - at_start
    generate.lines[:0] = [f"- default model resolved (fetched and converted on a first run) in "
                          f"{resolved:.1f} s: {folder}",
                          f"- Engine start-up {start_s:.1f} s on {device}"
                          + "".join(f"; {line}" for line in log.lines)]
    compiled = Section("Kernels compiled after start-up", [
        "Triton kernels compiled between the Engine's start-up and its shutdown (the "
        "attention kernels' variants are compiled at start-up; sampling and bitmask kernels "
        "compile at their first use):", "",
        *([f"- {name} x{count}" for name, count in sorted(later.items())] or ["- none"])],
        ok=None)
    return [generate, decode, compiled]


def _generate(engine, dry_run: bool) -> Section:
    params = {"max_new_tokens": 8 if dry_run else 32, "temperature": 0}
    started = time.perf_counter()
    outs = engine.generate(PROMPTS, params)
    took = time.perf_counter() - started
    lines = [f"- {len(PROMPTS)} prompts, greedy, {params['max_new_tokens']} new tokens: "
             f"{took:.2f} s", "", "| prompt | output |", "|---|---|"]
    for prompt, out in zip(PROMPTS, outs):
        text = out["text"].replace("|", "\\|").replace("\n", " ")[:120]
        lines.append(f"| {prompt} | {text} |")
    ok = all(out["meta_info"]["completion_tokens"] > 0 for out in outs)
    return Section("Engine generate (default model)", lines, ok=ok)


def _decode_rates(engine, dry_run: bool) -> Section:
    """tok/s of N decode steps: a batch's time for 1 + N new tokens less its time for 1 (its
    prompts already cached, so both prefill the same little)."""
    steps = 16 if dry_run else 128
    lines = [f"Greedy, distinct prompts, ignore_eos; {steps} decode steps = time(1 + {steps} "
             "new tokens) - time(1 new token), prompts already in the cache.", "",
             "| batch | decode tok/s | per step (ms) | end-to-end tok/s |", "|---:|---:|---:|---:|"]
    one = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    many = {**one, "max_new_tokens": 1 + steps}
    for batch in (1, 2) if dry_run else (1, 16, 64):
        prompts = [f"Request {i}: tell a short story about the number {i}." for i in range(batch)]
        engine.generate(prompts, one)  # prefill once: both timed runs hit the cache
        t_one = _timed(engine.generate, prompts, one)
        t_many = _timed(engine.generate, prompts, many)
        per_step = (t_many - t_one) / steps
        lines.append(f"| {batch} | {batch / per_step:.0f} | {per_step * 1e3:.2f} | "
                     f"{batch * (1 + steps) / t_many:.0f} |")
    return Section("Decode throughput", lines, ok=None)


def _timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def serve_section(device, timeout: float) -> Section:
    """`radixflow serve` on the device, healthy within `timeout` s, and one chat request."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = STAGE / "serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "radixflow.runtime.cli", "serve", "--port", str(port),
           "--device", device.type, "--max-total-tokens", str(KV_TOKENS[device.type])]
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        if not _wait_healthy(proc, url, timeout):
            return _failed(f"not healthy within {timeout:.0f} s (exit {proc.poll()})", log_path)
        up = time.perf_counter() - started
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
            model = json.loads(resp.read())["data"][0]["id"]
        body = {"model": model, "temperature": 0, "max_tokens": 64,
                "messages": [{"role": "user", "content": "Make up a person: name and age."}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "person", "schema": PERSON}}}
        started = time.perf_counter()
        reply = _post(url + "/v1/chat/completions", body)
        took = time.perf_counter() - started
        content = reply["choices"][0]["message"]["content"]
        person = json.loads(content)
        valid = (set(person) == {"name", "age"} and isinstance(person["name"], str)
                 and isinstance(person["age"], int))
        return Section("Served json_schema chat", [
            f"- `radixflow serve --device {device.type}` healthy after {up:.1f} s",
            f"- one chat completion with response_format json_schema: {took:.2f} s, "
            f"{reply['usage']['completion_tokens']} tokens, finish "
            f"{reply['choices'][0]['finish_reason']}",
            f"- content: `{content}` ({'matches' if valid else 'does NOT match'} the schema)"],
            ok=valid)
    except urllib.error.HTTPError as exc:
        return _failed(f"HTTP {exc.code}: {exc.read()[:2000]!r}", log_path)
    except Exception as exc:
        return _failed(f"{type(exc).__name__}: {exc}", log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _failed(why: str, log_path: Path) -> Section:
    tail = log_path.read_text(errors="replace").splitlines()[-40:]
    return Section("Served json_schema chat", [f"failed: {why}", "", "```", *tail, "```"],
                   ok=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        return json.loads(resp.read())
