"""The /program executor: runs a stretch's nodes over a native /generate callable.

Every gen and select becomes native /generate calls through `generate`, so the same executor
runs on the server (POST /program) and in the client (any backend without /program).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from radixflow.runtime.errors import InvalidRequest

from . import chat
from .errors import ForkError, error_to_wire
from .select import select_choice
from .wire import new_result, validate_program

Generate = Callable[[dict], Any]
OnText = Callable[[str | None, str], None]
SelectFn = Callable[..., tuple[int, dict, int]]

_GEN_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
             "separate_reasoning")
_TOKEN_COUNTS = ("prompt_tokens", "completion_tokens", "cached_tokens")


def execute_program(program: dict, generate: Generate, *,
                    max_select_choices: int | None = None) -> dict:
    """Server side of POST /program: run `program` with `generate` (a native /generate call).

    Returns the response dict (wire.py), JSON-serialisable. Raises InvalidRequest if `program`
    is malformed (a select with more than `max_select_choices` choices, too); errors while
    running are reported in "error". A `generate` that raises (ProgramCancelled: the client
    hung up) ends the run: no node after it starts.
    """
    validate_program(program, max_select_choices=max_select_choices)
    return ProgramExecutor(generate).run(program)


def run_program_locally(generate: Generate, program: dict, *, stream: bool = False,
                        on_text: OnText | None = None) -> dict:
    """Client side: run a /program body in this process, each gen a `generate` call (a native
    /generate body in, its response out). Exceptions stay objects in "error"."""
    executor = ProgramExecutor(generate, stream=stream, on_text=on_text, keep_exceptions=True)
    return executor.run(program)


class ProgramExecutor:
    """Runs program node lists over a native `generate` callable.

    `stream`: send gens with "stream": true (then `generate` returns an iterator of events) and
    report each new piece of text through `on_text(variable name or None, delta)`.
    `keep_exceptions`: put the original exception object in "error" (client side only; it is
    not JSON). `select`: replaces the logprob-scored select (backends without prompt logprobs).
    `with_messages`: keep the chat turns and send them with every gen and select.
    """

    def __init__(self, generate: Generate, *, stream: bool = False, on_text: OnText | None = None,
                 keep_exceptions: bool = False, select: SelectFn | None = None,
                 with_messages: bool = False):
        self.generate = generate
        self.stream = stream
        self.on_text = on_text
        self.keep_exceptions = keep_exceptions
        self.select = select or (lambda prompt, choices, method:
                                 select_choice(self.generate, prompt, choices, method))
        self.with_messages = with_messages

    def run(self, program: dict) -> dict:
        """Execute program["nodes"] after program["text"]; the response dict (wire.py)."""
        messages = copy.deepcopy(program.get("messages") or []) if self.with_messages else None
        return self._run_nodes(program.get("text", ""), program["nodes"], messages,
                               emit=self.on_text)

    def _run_nodes(self, prefix: str, nodes: list[dict], messages: list | None,
                   emit: OnText | None) -> dict:
        result = new_result()
        text = prefix
        last_fork: list[dict] | None = None
        for i, node in enumerate(nodes):
            try:
                piece = self._run_node(node, text, result, messages, emit, last_fork)
            except Exception as exc:  # reported in-band: the caller re-raises it as a typed error
                result["error"] = {**error_to_wire(exc), "node": i}
                if self.keep_exceptions:
                    result["error"]["exception"] = exc
                break
            if node["type"] == "fork":
                last_fork = result["branches"][-1]
            text += piece
            result["pieces"].append(piece)
            if messages is not None:
                chat.add_piece(messages, node, piece)
            if emit is not None and piece and node["type"] not in ("gen", "select"):
                emit(None, piece)
        result["text"] = text[len(prefix):]
        return result

    def _run_node(self, node: dict, text: str, result: dict, messages: list | None,
                  emit: OnText | None, last_fork: list[dict] | None) -> str:
        """Run one node after `text`; the text it appends."""
        match node["type"]:
            case "text" | "role_begin" | "role_end":
                return node["text"]
            case "gen":
                value, meta = self._gen(node, text, result, messages, emit)
                if isinstance(value, list):  # n > 1 samples: no one continuation to append
                    _store(result, node, value, meta)
                    return ""
                if node.get("tool_calls"):
                    _store(result, node, parse_tool_calls(value, node.get("name")), meta)
                    return value
            case "select":
                value, meta = self._select(node, text, result, messages, emit)
            case "fork":
                result["branches"].append(self._fork(node["branches"], text, messages, result))
                return ""
            case "join":
                return self._join(node.get("mode", "gather"), last_fork, result)
        _store(result, node, value, meta)
        return value

    def _gen(self, node: dict, text: str, result: dict, messages: list | None,
             emit: OnText | None) -> tuple[str, dict]:
        body: dict[str, Any] = {"text": text,
                                "sampling_params": dict(node.get("sampling_params") or {})}
        for key in _GEN_KEYS:
            if node.get(key) is not None:
                body[key] = node[key]
        if messages is not None:
            body.update(chat.message_kwargs(messages))
        result["meta"]["num_requests"] += 1
        n = body["sampling_params"].get("n")
        if isinstance(n, int) and n > 1:
            samples = self.generate(body)  # n texts: not streamed, a list of responses
            for resp in samples:
                _count_tokens(result, resp["meta_info"])
            return [r["text"] for r in samples], [r["meta_info"] for r in samples]
        if not self.stream:
            resp = self.generate(body)
            _count_tokens(result, resp["meta_info"])
            return resp["text"], resp["meta_info"]
        body["stream"] = True
        out, meta, logprobs = "", {}, []
        for event in self.generate(body):
            delta = event["text"][len(out):]
            out = event["text"]
            meta = event["meta_info"]
            logprobs.extend(meta.get("output_token_logprobs") or [])
            if emit is not None and delta:
                emit(node.get("name"), delta)
        if "output_token_logprobs" in meta:  # deltas on the wire; the variable keeps them all
            meta = {**meta, "output_token_logprobs": logprobs}
        _count_tokens(result, meta)
        return out, meta

    def _select(self, node: dict, text: str, result: dict, messages: list | None,
                emit: OnText | None) -> tuple[str, dict]:
        extra = {} if messages is None else chat.message_kwargs(messages)
        index, meta, num_requests = self.select(
            text, list(node["choices"]), node.get("method", "token_length_normalized"), **extra)
        result["meta"]["num_requests"] += num_requests
        value = node["choices"][index]
        if emit is not None:
            emit(node.get("name"), value)
        return value, meta

    def _fork(self, branches: list[list[dict]], text: str, messages: list | None,
              result: dict) -> list[dict]:
        def run_branch(nodes: list[dict]) -> dict:
            branch_messages = copy.deepcopy(messages) if messages is not None else None
            return self._run_nodes(text, nodes, branch_messages, emit=None)

        if len(branches) == 1:
            results = [run_branch(branches[0])]
        else:
            # One thread per branch: branches may block on each other's server-side batching.
            with ThreadPoolExecutor(max_workers=len(branches),
                                    thread_name_prefix="rf-fork") as pool:
                results = list(pool.map(run_branch, branches))
        for branch in results:
            for key, value in branch["meta"].items():
                result["meta"][key] += value
        return results

    def _join(self, mode: str, branches: list[dict] | None, result: dict) -> str:
        if branches is None:
            raise InvalidRequest("join without a fork before it")
        failed = {i: b["error"]["message"] for i, b in enumerate(branches) if b["error"]}
        if failed:
            raise ForkError(failed)
        if mode == "concat":
            return "".join(b["text"] for b in branches)
        names = [n for b in branches for n in b["variables"]]
        for name in dict.fromkeys(names):
            result["variables"][name] = [b["variables"].get(name) for b in branches]
            result["meta_info"][name] = [b["meta_info"].get(name) for b in branches]
        return ""


def _store(result: dict, node: dict, value: Any, meta: Any) -> None:
    if node.get("name") is not None:
        result["variables"][node["name"]] = value
        result["meta_info"][node["name"]] = meta
        if node.get("separate_reasoning"):  # the thinking, apart from the answer (`value`)
            result["variables"][node["name"] + "_reasoning_content"] = (
                [m.get("reasoning_text") for m in meta] if isinstance(meta, list)
                else meta.get("reasoning_text"))


def parse_tool_calls(text: str, name: str | None) -> list[dict]:
    """The calls a tool gen wrote: its JSON list of {"name", "arguments"} (wire.py)."""
    try:
        calls = json.loads(text)
    except ValueError:
        raise InvalidRequest(f"the tool call in {name!r} is not complete JSON (did max_tokens "
                             f"cut it?): {text[-80:]!r}") from None
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise InvalidRequest(f"the tool call in {name!r} is not a list of calls")
    return calls


def _count_tokens(result: dict, meta: dict) -> None:
    for key in _TOKEN_COUNTS:
        value = meta.get(key)
        if isinstance(value, int):
            result["meta"][key] += value
