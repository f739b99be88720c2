"""Latency to the first `delta.tool_calls` chunk of a streamed chat completion with tools.

A streamed tool call now arrives as it is generated: its name, then its arguments in pieces.
This measures, per request (tool_choice named, greedy): the first tool_calls chunk (the
call's name), the first argument fragment, the last chunk, and the non-streamed request's
latency for comparison (before, the stream held the whole call until the output was done, so
the first tool_calls chunk came at about that time).

    python -m bench.tool_stream                          # the default model (radixflow serve)
    python -m bench.tool_stream --tiny qwen3_coder       # a tiny model on Qwen3-Coder's template
    python -m bench.tool_stream --url http://127.0.0.1:30000   # a running server
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

NOTE = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "text": {"type": "string"},
    "tags": {"type": "array", "items": {"enum": ["work", "home", "urgent"]}, "maxItems": 3}},
    "required": ["title", "text"]}
TOOLS = [{"type": "function", "function": {"name": "save_note", "description":
                                           "Save a note for the user", "parameters": NOTE}}]
TOPICS = ["the dentist on Friday", "buying milk", "the quarterly report", "calling mum",
          "the car service", "a birthday present", "the tax return", "watering the plants"]
TINY = {  # --tiny NAME: (arch, tokenizer preset, chat template, server args)
    "qwen3_coder": ("qwen3", "qwen3", "Qwen3-Coder", {}),
    "hermes": ("qwen3", "qwen3", "Qwen-Qwen3-0.6B", {}),
    "llama3": ("llama", "llama3", "meta-llama-Llama-3.2-3B-Instruct", {}),
    "pythonic": ("llama", "llama3", "meta-llama-Llama-3.2-3B-Instruct",
                 {"tool_call_parser": "pythonic"}),
    "mistral": ("mistral", "mistral", "mistralai-Mistral-Nemo-Instruct-2407", {}),
}


def one_run(client, model: str, topic: str, max_tokens: int) -> dict:
    kwargs = {"model": model, "max_tokens": max_tokens, "temperature": 0, "tools": TOOLS,
              "tool_choice": {"type": "function", "function": {"name": "save_note"}},
              "messages": [{"role": "user", "content": f"Remind me about {topic}."}]}
    start = time.perf_counter()
    name_at = args_at = None
    pieces = 0
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        now = time.perf_counter() - start
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                if delta.function.name and name_at is None:
                    name_at = now
                if delta.function.arguments:
                    args_at = now if args_at is None else args_at
                    pieces += 1
    last = time.perf_counter() - start
    start = time.perf_counter()
    whole = client.chat.completions.create(**kwargs)
    return {"name": name_at, "args": args_at, "last": last, "pieces": pieces,
            "whole": time.perf_counter() - start, "tokens": whole.usage.completion_tokens}


def summary(runs: list[dict]) -> str:
    def ms(key: str) -> str:
        values = sorted(r[key] * 1000 for r in runs if r[key] is not None)
        return (f"{statistics.median(values):.0f} ms (min {values[0]:.0f}, max {values[-1]:.0f})"
                if values else "-")

    rows = [("first tool_calls chunk (id + name)", ms("name")),
            ("first arguments fragment", ms("args")), ("last chunk", ms("last")),
            ("non-streamed request", ms("whole"))]
    pieces = statistics.median(r["pieces"] for r in runs)
    tokens = statistics.median(r["tokens"] for r in runs)
    lines = [f"| measure (median of {len(runs)}) | latency |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    lines.append(f"| argument fragments per call | {pieces:.0f} |")
    lines.append(f"| completion tokens | {tokens:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (else one is started)")
    parser.add_argument("--tiny", choices=sorted(TINY), help="a tiny random model on a real "
                        "tokenizer and template (tests/helpers/test_assets.py) instead of the "
                        "default model")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    import openai

    server = None
    if args.url is None:
        server = start_server(args.tiny)
    url = args.url or server.url
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=600)
        model = client.models.list().data[0].id
        one_run(client, model, "warming up", args.max_tokens)  # compiles the grammar
        runs = [one_run(client, model, TOPICS[i % len(TOPICS)], args.max_tokens)
                for i in range(args.runs)]
    finally:
        if server is not None:
            server.shutdown()
    print(summary(runs))


def start_server(tiny: str | None):
    from radixflow.runtime.server.process import ServerProcess

    if tiny is None:
        return ServerProcess(None, served_model_name="default", log_level="warning")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers.test_assets import tiny_model_dir

    arch, tokenizer, template, extra = TINY[tiny]
    folder = tiny_model_dir(arch, tokenizer, template, num_hidden_layers=1,
                            max_position_embeddings=4096)
    return ServerProcess(str(folder), served_model_name="tiny", log_level="warning",
                         max_total_tokens=4096, **extra)


if __name__ == "__main__":
    main()
