"""Issue #24's attacks against a real server (default model), timed, with a stream beside them.

A streamed /generate runs while the attacks go in, one after another: five different 33 KB
`oneOf` schemas of 1,997 consts (each one new, so no cache helps), a client-written chat
template in `chat_template_kwargs`, a `text/plain` body, a 50 MB Content-Length, a /generate
batch past --max-prompts-per-request and a cross-site request. For each: the status and how
long the answer took; for the stream: its longest inter-token gap while the attacks ran.

    python -m bench.attacks            # -> a section of bench/results/attacks.md
"""

from __future__ import annotations

import argparse
import datetime
import socket
import statistics
import threading
import time
from collections.abc import Callable

import requests

from .report import Run, fmt, publish

JINJA = ("{% for a in range(99999) %}{% for b in range(99999) %}x{% endfor %}{% endfor %}")


def one_of_schema(variant: int) -> dict:
    return {"oneOf": [{"const": i + (10_000 * variant if i == 7 else 0)} for i in range(1997)],
            "$defs": {"a": {}}}


def attacks(url: str, model: str) -> list[tuple[str, Callable]]:
    def chat(extra: dict, max_tokens: int = 4) -> requests.Response:
        return requests.post(url + "/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}], **extra})

    def schema(variant: int):
        return lambda: chat({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": one_of_schema(variant)}}})

    def huge_length() -> int:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nContent-Length: 52428800\r\n\r\n{")
            s.settimeout(10)
            return int(s.recv(4096).split()[1])

    found = [(f"33 KB oneOf schema #{k + 1}", schema(k)) for k in range(5)]
    found += [
        ("client chat_template", lambda: chat({"chat_template_kwargs": {"chat_template": JINJA}})),
        ("text/plain body", lambda: requests.post(url + "/generate", data=b'{"text": "hi"}',
                                                  headers={"Content-Type": "text/plain"})),
        ("50 MB Content-Length", huge_length),
        ("2,000 prompts x n=2", lambda: requests.post(url + "/generate", json={
            "text": ["hi"] * 2000, "sampling_params": {"n": 2, "max_new_tokens": 1}})),
        ("cross-site GET /flush_cache", lambda: requests.get(
            url + "/flush_cache", headers={"Sec-Fetch-Site": "cross-site"})),
    ]
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from radixflow.kernels.cpu.features import cpu_features
    from radixflow.runtime.server.process import ServerProcess

    rows = []
    with ServerProcess(None, log_level="warning", start_timeout=600) as server:
        url = server.url
        model = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        times: list[float] = []

        def stream() -> None:
            body = {"text": "Once upon a time", "stream": True,
                    "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
            with requests.post(url + "/generate", json=body, stream=True, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data:"):
                        times.append(time.monotonic())
                    if done.is_set():
                        break

        done = threading.Event()
        beside = threading.Thread(target=stream)
        beside.start()
        while len(times) < 5:
            time.sleep(0.05)
        t0 = time.monotonic()
        for name, attack in attacks(url, model):
            start = time.monotonic()
            answer = attack()
            status = answer if isinstance(answer, int) else answer.status_code
            rows.append((name, status, time.monotonic() - start))
        t1 = time.monotonic()
        time.sleep(0.5)
        done.set()
        beside.join()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= t0 and a <= t1]
    all_gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    lines = [f"# Issue #24's attacks against `radixflow serve` ({datetime.date.today()})", "",
             f"`python -m bench.attacks`; {cpu_features().describe()}; default model "
             "(SmolLM2-135M-Instruct). A streamed /generate ran beside them.", "",
             "| attack | status | answered in (s) |", "|---|---|---|",
             *[f"| {name} | {status} | {fmt(seconds)} |" for name, status, seconds in rows], "",
             f"The stream's longest inter-token gap while the attacks ran: {fmt(max(gaps))} s "
             f"(its median gap over the whole run: {fmt(statistics.median(all_gaps))} s).",
             "The schemas are accepted (their consts are disjoint) and compiled, each new; the "
             "200s include generating 4 tokens under them.", ""]
    text = "\n".join(lines)
    publish(text, None if args.no_write else Run("attacks", str(datetime.date.today())))


if __name__ == "__main__":
    main()
