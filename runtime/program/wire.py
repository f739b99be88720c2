"""The /program wire format: a straight-line stretch of a DSL program, as JSON.

Request (JSON object)::

    {"text": "<the program's text so far>",
     "nodes": [
       {"type": "text", "text": "Q: 2+2?\\nA:"},
       {"type": "role_begin", "role": "user", "text": "<|im_start|>user\\n"},   # rendered by
       {"type": "role_end", "role": "user", "text": "<|im_end|>\\n"},           # the client
       {"type": "gen", "name": "a", "sampling_params": {...native...},
        "return_logprob": false, "logprob_start_len": null, "top_logprobs_num": null,
        "tool_calls": false,    # true: the output is a JSON list of calls, stored parsed
        "separate_reasoning": false},  # true: the answer is the value and the text appended,
                                       # the thinking goes to "<name>_reasoning_content"
       {"type": "select", "name": "b", "choices": ["yes", "no"],
        "method": "token_length_normalized"},
       {"type": "fork", "branches": [[node, ...], [node, ...]]},  # branches run concurrently
       {"type": "join", "mode": "gather" | "concat"}               # joins the latest fork
     ]}

Response::

    {"text": "<text appended by these nodes>",
     "pieces": ["<text appended by node 0>", ...],                 # one per top-level node
     "variables": {"a": "4", ...}, "meta_info": {"a": {...native meta_info...}, ...},
                                  # sampling_params.n > 1: a list of texts (none appended)
     "branches": [[<branch result, same shape>, ...], ...],        # one list per fork node
     "meta": {"num_requests": 3, "prompt_tokens": ..., "completion_tokens": ...,
              "cached_tokens": ...},
     "error": null | {"type": "GrammarError", "message": "...", "node": 4}}

An error while running is reported in-band in "error" (the text before it is kept); a
malformed program raises InvalidRequest. A failed branch reports its own "error"; the other
branches go on. The server refuses (400) a select with more choices than --max-select-choices;
a program whose client hangs up is stopped (its gen in flight aborted, no later one started).
"""

from __future__ import annotations

from typing import Any

from radixflow.runtime.errors import InvalidRequest

from .select import SELECT_METHODS

NODE_TYPES = ("text", "role_begin", "role_end", "gen", "select", "fork", "join")
MODEL_NODE_TYPES = ("gen", "select")
JOIN_MODES = ("gather", "concat")
MAX_NODES = 4096
MAX_BRANCHES = 64
MAX_DEPTH = 8


def validate_program(program: Any, *, max_select_choices: int | None = None) -> None:
    """Raise InvalidRequest naming the first thing wrong with a /program body.
    `max_select_choices` (the server's --max-select-choices): the most choices of one select."""
    if not isinstance(program, dict):
        raise InvalidRequest("a program must be a JSON object with 'nodes'")
    if not isinstance(program.get("text", ""), str):
        raise InvalidRequest("program 'text' must be a string", param="text")
    count = _validate_nodes(program.get("nodes"), "nodes", depth=0,
                            max_choices=max_select_choices)
    if count > MAX_NODES:
        raise InvalidRequest(f"a program may hold at most {MAX_NODES} nodes, got {count}")


def _validate_nodes(nodes: Any, where: str, *, depth: int, max_choices: int | None) -> int:
    """The number of nodes in `nodes` (branches included), checked."""
    if not isinstance(nodes, list):
        raise InvalidRequest(f"{where} must be a list of nodes", param=where)
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"forks may nest at most {MAX_DEPTH} deep", param=where)
    count, seen_fork = 0, False
    for i, node in enumerate(nodes):
        at = f"{where}[{i}]"
        if not isinstance(node, dict) or node.get("type") not in NODE_TYPES:
            raise InvalidRequest(f"{at} must be an object with 'type' in {NODE_TYPES}", param=at)
        count += 1 + _validate_node(node, at, depth=depth, seen_fork=seen_fork,
                                    max_choices=max_choices)
        seen_fork = seen_fork or node["type"] == "fork"
    return count


def _validate_node(node: dict, at: str, *, depth: int, seen_fork: bool,
                   max_choices: int | None) -> int:
    """Check one node; the number of nodes in its branches."""
    def invalid(what: str) -> InvalidRequest:
        return InvalidRequest(f"{at} {what}", param=at)

    kind = node["type"]
    match kind:
        case "text" | "role_begin" | "role_end":
            if not isinstance(node.get("text"), str):
                raise invalid(f"({kind}) needs a string 'text'")
            if kind != "text" and not isinstance(node.get("role"), str):
                raise invalid(f"({kind}) needs a string 'role'")
        case "gen" | "select":
            if node.get("name") is not None and not isinstance(node["name"], str):
                raise invalid("'name' must be a string or null")
            if kind == "gen" and not isinstance(node.get("sampling_params", {}), dict):
                raise invalid("'sampling_params' must be an object")
            for flag in ("tool_calls", "separate_reasoning"):
                if kind == "gen" and not isinstance(node.get(flag, False), bool):
                    raise invalid(f"'{flag}' must be a boolean")
            if kind == "select":
                choices = node.get("choices")
                if (not isinstance(choices, list) or not choices
                        or not all(isinstance(c, str) and c for c in choices)):
                    raise invalid("'choices' must be a non-empty list of non-empty strings")
                if max_choices is not None and len(choices) > max_choices:
                    raise invalid(f"has {len(choices)} choices; the limit is {max_choices} "
                                  f"(--max-select-choices)")
                if node.get("method", "token_length_normalized") not in SELECT_METHODS:
                    raise invalid(f"'method' must be one of {SELECT_METHODS}")
        case "fork":
            branches = node.get("branches")
            if not isinstance(branches, list) or not 1 <= len(branches) <= MAX_BRANCHES:
                raise invalid(f"'branches' must be a list of 1..{MAX_BRANCHES} node lists")
            return sum(_validate_nodes(branch, f"{at}.branches[{b}]", depth=depth + 1,
                                       max_choices=max_choices)
                       for b, branch in enumerate(branches))
        case "join":
            if node.get("mode", "gather") not in JOIN_MODES:
                raise invalid("'mode' must be 'gather' or 'concat'")
            if not seen_fork:
                raise invalid("joins, but no fork precedes it")
    return 0


def has_model_node(nodes: list[dict]) -> bool:
    """Whether running `nodes` calls the model (a gen or select, in any branch)."""
    return any(node["type"] in MODEL_NODE_TYPES
               or (node["type"] == "fork" and any(has_model_node(b) for b in node["branches"]))
               for node in nodes)


def new_result() -> dict:
    """An empty response (module docstring)."""
    return {"text": "", "pieces": [], "variables": {}, "meta_info": {}, "branches": [],
            "meta": {"num_requests": 0, "prompt_tokens": 0, "completion_tokens": 0,
                     "cached_tokens": 0},
            "error": None}
