"""The /program wire format and its executor: a straight-line stretch of a program, run in one go.

Request (JSON object)::

    {"text": "<the program's text so far>",
     "nodes": [
       {"type": "text", "text": "Q: 2+2?\\nA:"},
       {"type": "role_begin", "role": "user", "text": "<|im_start|>user\\n"},   # rendered by
       {"type": "role_end", "role": "user", "text": "<|im_end|>\\n"},           # the client
       {"type": "gen", "name": "a", "sampling_params": {...native...},
        "return_logprob": false, "logprob_start_len": null, "top_logprobs_num": null},
       {"type": "select", "name": "b", "choices": ["yes", "no"],
        "method": "token_length_normalized"},
       {"type": "fork", "branches": [[node, ...], [node, ...]]},  # branches run concurrently
       {"type": "join", "mode": "gather" | "concat"}               # joins the latest fork
     ]}

Response::

    {"text": "<text appended by these nodes>",
     "pieces": ["<text appended by node 0>", ...],                 # one per top-level node
     "variables": {"a": "4", ...}, "meta_info": {"a": {...native meta_info...}, ...},
     "branches": [[<branch result, same shape>, ...], ...],        # one list per fork node
     "meta": {"num_requests": 3, "prompt_tokens": ..., "completion_tokens": ..., "cached_tokens": ...},
     "error": null | {"type": "GrammarError", "message": "...", "node": 4}}

Every gen/select becomes native /generate calls through `generate`, so the same executor runs
on the server (POST /program) and in the client (any backend without /program). An error while
running is reported in-band in "error" (the text before it is kept); a malformed program raises
InvalidRequest. A failed branch reports its own "error"; the other branches go on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .choices import select_choice
from .errors import ForkError, InvalidRequest, error_to_wire
from .ir import SELECT_METHODS

Generate = Callable[[dict], Any]
OnText = Callable[[str | None, str], None]

NODE_TYPES = ("text", "role_begin", "role_end", "gen", "select", "fork", "join")
MAX_NODES = 4096
MAX_BRANCHES = 64
MAX_DEPTH = 8
_GEN_KEYS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


def execute_program(program: dict, generate: Generate) -> dict:
    """Server side of POST /program: run `program` with `generate` (a native /generate call).

    Returns the response dict of the module docstring (JSON-serialisable). Raises
    InvalidRequest if `program` is malformed; errors while running are reported in "error".
    """
    validate_program(program)
    return ProgramExecutor(generate).run(program)


def validate_program(program: Any) -> None:
    """Raise InvalidRequest naming the first thing wrong with a /program body."""
    if not isinstance(program, dict):
        raise InvalidRequest("a program must be a JSON object with 'nodes'")
    if not isinstance(program.get("text", ""), str):
        raise InvalidRequest("program 'text' must be a string", param="text")
    count = _validate_nodes(program.get("nodes"), "nodes", depth=0)
    if count > MAX_NODES:
        raise InvalidRequest(f"a program may hold at most {MAX_NODES} nodes, got {count}")


def _validate_nodes(nodes: Any, where: str, *, depth: int) -> int:
    if not isinstance(nodes, list):
        raise InvalidRequest(f"{where} must be a list of nodes", param=where)
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"forks may nest at most {MAX_DEPTH} deep", param=where)
    count, seen_fork = 0, False
    for i, node in enumerate(nodes):
        at = f"{where}[{i}]"
        if not isinstance(node, dict) or node.get("type") not in NODE_TYPES:
            raise InvalidRequest(f"{at} must be an object with 'type' in {NODE_TYPES}", param=at)
        kind = node["type"]
        count += 1
        if kind in ("text", "role_begin", "role_end") and not isinstance(node.get("text"), str):
            raise InvalidRequest(f"{at} ({kind}) needs a string 'text'", param=at)
        if kind in ("role_begin", "role_end") and not isinstance(node.get("role"), str):
            raise InvalidRequest(f"{at} ({kind}) needs a string 'role'", param=at)
        if kind in ("gen", "select") and node.get("name") is not None and not isinstance(node["name"], str):
            raise InvalidRequest(f"{at} 'name' must be a string or null", param=at)
        if kind == "gen" and not isinstance(node.get("sampling_params", {}), dict):
            raise InvalidRequest(f"{at} 'sampling_params' must be an object", param=at)
        if kind == "select":
            choices = node.get("choices")
            if (not isinstance(choices, list) or not choices
                    or not all(isinstance(c, str) and c for c in choices)):
                raise InvalidRequest(f"{at} 'choices' must be a non-empty list of non-empty strings",
                                     param=at)
            if node.get("method", "token_length_normalized") not in SELECT_METHODS:
                raise InvalidRequest(f"{at} 'method' must be one of {SELECT_METHODS}", param=at)
        if kind == "fork":
            branches = node.get("branches")
            if not isinstance(branches, list) or not 1 <= len(branches) <= MAX_BRANCHES:
                raise InvalidRequest(f"{at} 'branches' must be a list of 1..{MAX_BRANCHES} node lists",
                                     param=at)
            for b, branch in enumerate(branches):
                count += _validate_nodes(branch, f"{at}.branches[{b}]", depth=depth + 1)
            seen_fork = True
        if kind == "join":
            if node.get("mode", "gather") not in ("gather", "concat"):
                raise InvalidRequest(f"{at} 'mode' must be 'gather' or 'concat'", param=at)
            if not seen_fork:
                raise InvalidRequest(f"{at} joins, but no fork precedes it", param=at)
    return count


def _new_result() -> dict:
    return {"text": "", "pieces": [], "variables": {}, "meta_info": {}, "branches": [],
            "meta": {"num_requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                     "cached_tokens": 0},
            "error": None}


class ProgramExecutor:
    """Runs program node lists over a native `generate` callable.

    `stream`: send gens with "stream": true (then `generate` returns an iterator of events) and
    report each new piece of text through `on_text(variable name or None, delta)`.
    `keep_exceptions`: put the original exception object in "error" (client side only; it is
    not JSON). `select`: replaces the logprob-scored select (backends without prompt logprobs).
    """

    def __init__(self, generate: Generate, *, stream: bool = False, on_text: OnText | None = None,
                 keep_exceptions: bool = False,
                 select: Callable[..., tuple[int, dict, int]] | None = None,
                 with_messages: bool = False):
        self.generate = generate
        self.stream = stream
        self.on_text = on_text
        self.keep_exceptions = keep_exceptions
        self.select = select or (lambda prompt, choices, method:
                                 select_choice(self.generate, prompt, choices, method))
        self.with_messages = with_messages

    def run(self, program: dict) -> dict:
        """Execute program["nodes"] after program["text"]; the response dict (module docstring)."""
        messages = copy.deepcopy(program.get("messages") or []) if self.with_messages else None
        return self._run_nodes(program.get("text", ""), program["nodes"], messages,
                               emit=self.on_text)

    def _run_nodes(self, prefix: str, nodes: list[dict], messages: list | None,
                   emit: OnText | None) -> dict:
        result = _new_result()
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
            if emit is not None and piece and node["type"] not in ("gen", "select"):
                emit(None, piece)
        result["text"] = text[len(prefix):]
        return result

    def _run_node(self, node: dict, text: str, result: dict, messages: list | None,
                  emit: OnText | None, last_fork: list[dict] | None) -> str:
        kind = node["type"]
        if kind == "text":
            _add_to_open_message(messages, node["text"])
            return node["text"]
        if kind == "role_begin":
            if messages is not None:
                messages.append({"role": node["role"], "content": "", "open": True})
            return node["text"]
        if kind == "role_end":
            if messages is not None and messages and messages[-1].get("open"):
                messages[-1].pop("open")
            return node["text"]
        if kind == "gen":
            out, meta = self._gen(node, text, result, messages, emit)
        elif kind == "select":
            extra = {} if messages is None else _message_kwargs(messages)
            index, meta, num_requests = self.select(text, list(node["choices"]),
                                                    node.get("method", "token_length_normalized"),
                                                    **extra)
            result["meta"]["num_requests"] += num_requests
            out = node["choices"][index]
            if emit is not None:
                emit(node.get("name"), out)
        elif kind == "fork":
            branches = self._fork(node["branches"], text, messages)
            for branch in branches:
                for key, value in branch["meta"].items():
                    result["meta"][key] += value
            result["branches"].append(branches)
            return ""
        else:  # join
            return self._join(node.get("mode", "gather"), last_fork, result)
        _add_to_open_message(messages, out)
        if node.get("name") is not None:
            result["variables"][node["name"]] = out
            result["meta_info"][node["name"]] = meta
        return out

    def _gen(self, node: dict, text: str, result: dict, messages: list | None,
             emit: OnText | None) -> tuple[str, dict]:
        body: dict[str, Any] = {"text": text, "sampling_params": dict(node.get("sampling_params") or {})}
        for key in _GEN_KEYS:
            if node.get(key) is not None:
                body[key] = node[key]
        if messages is not None:
            body.update(_message_kwargs(messages))
        result["meta"]["num_requests"] += 1
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

    def _fork(self, branches: list[list[dict]], text: str, messages: list | None) -> list[dict]:
        def run_branch(nodes: list[dict]) -> dict:
            branch_messages = copy.deepcopy(messages) if messages is not None else None
            return self._run_nodes(text, nodes, branch_messages, emit=None)

        if len(branches) == 1:
            return [run_branch(branches[0])]
        # One thread per branch: branches may block on each other's server-side batching.
        with ThreadPoolExecutor(max_workers=len(branches), thread_name_prefix="rf-fork") as pool:
            return list(pool.map(run_branch, branches))

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


def _message_kwargs(messages: list) -> dict:
    """The chat so far, for backends that need messages rather than text (OpenAI)."""
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "in_open_role": messages[-1]["role"] if messages and messages[-1].get("open") else None}


def _add_to_open_message(messages: list | None, text: str) -> None:
    if messages and messages[-1].get("open"):
        messages[-1]["content"] += text


def _count_tokens(result: dict, meta: dict) -> None:
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        value = meta.get(key)
        if isinstance(value, int):
            result["meta"][key] += value

