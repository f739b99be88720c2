"""The program IR: frozen nodes a program appends to its state, and the calls that build them.

`s += "Q: " + rf.gen("a", max_tokens=8)` appends Seq(Text, Gen). Nodes are plain data; the
interpreter (state.py) compiles them to the /program wire format (radixflow.runtime.program).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.constrained import prepare
from radixflow.runtime.program.select import SELECT_METHODS
from radixflow.runtime.sampling_params import check_option

from .errors import GrammarError, InvalidRequest
from .params import FIELDS, GenParams
from .tools import Tool, as_tools, calls_schema

_METHOD_ALIASES = {"mean": "token_length_normalized",
                   "unconditional": "unconditional_likelihood_normalized"}

# dtype -> (regex, extra stop strings), as SGLang's frontend turns `gen(dtype=...)` into a regex.
_DTYPE_REGEX: dict[Any, tuple[str, tuple[str, ...]]] = {
    int: (r"[-+]?[0-9]+[ \n]*", (" ", "\n")),
    float: (r"[-+]?[0-9]*\.?[0-9]+[ \n]*", (" ", "\n")),
    str: (r"\"[\w\d\s]*\"", ()),
    bool: (r"(True|False)", ()),
}


class Node:
    """Base of every IR node: nodes and strings concatenate with `+` into a Seq."""

    def __add__(self, other: NodeLike) -> Seq:
        return Seq.of(self, other)

    def __radd__(self, other: NodeLike) -> Seq:
        return Seq.of(other, self)


@dataclass(frozen=True)
class Text(Node):
    text: str


@dataclass(frozen=True)
class Gen(Node):
    name: str | None
    params: GenParams
    regex: str | None = None
    json_schema: str | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    n: int = 1
    tools: tuple[Tool, ...] = ()
    reasoning: bool = False  # a reasoning model's thinking goes to `<name>_reasoning_content`
    thinking_budget: int | None = None


@dataclass(frozen=True)
class Select(Node):
    name: str | None
    choices: tuple[str, ...]
    method: str = "token_length_normalized"


@dataclass(frozen=True)
class RoleBegin(Node):
    role: str


@dataclass(frozen=True)
class RoleEnd(Node):
    role: str


@dataclass(frozen=True)
class Seq(Node):
    nodes: tuple[Node, ...]

    @classmethod
    def of(cls, *items: NodeLike) -> Seq:
        return cls(tuple(flatten(items)))


NodeLike = Node | str | Iterable["NodeLike"]


def flatten(item: Any) -> list[Node]:
    """Nodes of `item` in order: strings become Text, Seqs and lists are spliced."""
    if isinstance(item, str):
        return [Text(item)] if item else []
    if isinstance(item, Seq):
        return list(item.nodes)
    if isinstance(item, Node):
        return [item]
    if isinstance(item, (list, tuple)):
        return [node for sub in item for node in flatten(sub)]
    raise InvalidRequest(
        f"cannot add {type(item).__name__} to a program: use a str, rf.gen(...), rf.select(...) "
        f"or a role block (got {item!r:.80})")


def _check_name(name: Any) -> str | None:
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidRequest(f"a variable name must be a non-empty string, got {name!r}")
    return name


def check_regex(regex: str) -> str:
    """The regex itself, or GrammarError if Python's `re` cannot compile it or the server's
    constraint front door would refuse it (with the server's message)."""
    if not isinstance(regex, str):
        raise GrammarError(f"regex must be a string, got {type(regex).__name__}")
    try:
        re.compile(regex)
    except re.error as exc:
        raise GrammarError(f"regex {regex!r} does not compile: {exc}") from None
    prepare("regex", regex)
    return regex


def schema_to_str(schema: Any) -> str:
    """A JSON Schema given as a dict, a JSON string or a pydantic model class, as a JSON string;
    GrammarError if the server's constraint front door would refuse it (its message)."""
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"json_schema is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise GrammarError("json_schema must be a JSON object")
        text = schema
    elif isinstance(schema, dict):
        text = json.dumps(schema)
    else:
        raise GrammarError(
            f"json_schema must be a dict, a JSON string or a pydantic model, "
            f"got {type(schema).__name__}")
    prepare("json_schema", text)
    return text


def check_choices(choices: Any) -> tuple[str, ...]:
    if isinstance(choices, str) or not isinstance(choices, Iterable):
        raise InvalidRequest(f"choices must be a list of strings, got {choices!r:.80}")
    out = tuple(choices)
    if not out:
        raise InvalidRequest("choices is empty: select needs at least one choice")
    bad = [c for c in out if not isinstance(c, str) or not c]
    if bad:
        raise InvalidRequest(f"every choice must be a non-empty string, got {bad[0]!r}")
    return out


def check_method(method: str) -> str:
    method = _METHOD_ALIASES.get(method, method)
    if method not in SELECT_METHODS:
        raise InvalidRequest(f"unknown select method {method!r}; use one of {SELECT_METHODS}")
    return method


def gen(
    name: str | None = None,
    *,
    regex: str | None = None,
    json_schema: Any = None,
    choices: list[str] | None = None,
    choices_method: str = "token_length_normalized",
    dtype: type | None = None,
    return_logprob: bool = False,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    n: int = 1,
    tools: list[Any] | None = None,
    parallel_tool_calls: bool = True,
    reasoning: bool = False,
    separate_reasoning: bool | None = None,
    thinking_budget: int | None = None,
    **sampling: Any,
) -> Node:
    """Generate text into variable `name`.

    `sampling`: the sampling options, by GenParams' field names (`max_tokens=`, `stop=` (a
    string or a list), `temperature=`, ...); those not given use the run's defaults.
    `regex` / `json_schema` (dict, JSON string or pydantic model) constrain the output;
    `choices` turns the call into `select`; `dtype` (int, float, str, bool) is shorthand for a
    regex; `stop_regex` ends the text at a match, like a stop string. `n` > 1 samples n
    continuations of the same prompt in one request: the variable holds the list of their
    texts and none of them is appended to the program's text.
    `tools` (Python functions or OpenAI tool dicts) makes the gen a tool call: the output is a
    JSON list of `{"name", "arguments"}` held to the tools' schemas (one call unless
    `parallel_tool_calls`), the variable holds the parsed list (`rf.call_tools` runs them).
    `reasoning` (SGLang: `separate_reasoning`), on a server with --reasoning-parser: the
    model thinks first; the variable and the program's text get the answer, the thinking goes to
    `<name>_reasoning_content`, a regex / schema / tools constraint applies to the answer only,
    and `thinking_budget` (tokens) ends the thinking.
    Raises GrammarError for a regex that does not compile or a schema that is not JSON,
    InvalidRequest for an empty choice list or a bad n / tools.
    """
    unknown = [key for key in sampling if key not in FIELDS]
    if unknown:
        raise TypeError(f"gen() got an unexpected keyword argument {unknown[0]!r}")
    name = _check_name(name)
    if choices is not None:
        return select(name, choices, method=choices_method)
    params = GenParams.make(**sampling)
    if dtype is not None:
        if dtype not in _DTYPE_REGEX:
            raise InvalidRequest(f"dtype must be one of int, float, str, bool; got {dtype!r}")
        regex, extra_stop = _DTYPE_REGEX[dtype]
        if extra_stop:
            params = dataclasses.replace(params, stop=tuple(params.stop or ()) + extra_stop)
    if sum(x is not None for x in (regex, json_schema, tools)) > 1:
        raise InvalidRequest("give at most one of regex, json_schema and tools")
    check_option("n", n)
    tool_specs = as_tools(tools) if tools is not None else ()
    if tool_specs:
        if n != 1:
            raise InvalidRequest("a gen with tools takes n=1")
        json_schema = calls_schema(tool_specs, parallel=parallel_tool_calls)
    reasoning = bool(reasoning or separate_reasoning)
    check_option("thinking_budget", thinking_budget)
    return Gen(
        name, params,
        regex=check_regex(regex) if regex is not None else None,
        json_schema=schema_to_str(json_schema) if json_schema is not None else None,
        return_logprob=return_logprob, logprob_start_len=logprob_start_len,
        top_logprobs_num=top_logprobs_num, n=n, tools=tool_specs, reasoning=reasoning,
        thinking_budget=thinking_budget)


def select(name: str | None = None, choices: list[str] | None = None,
           temperature: float = 0.0, choices_method: str | None = None, *,
           method: str = "token_length_normalized") -> Select:
    """Pick one of `choices` by the model's log-probabilities of each choice's tokens.

    `method` (SGLang: `choices_method`): "token_length_normalized" (mean, default), "sum",
    "unconditional_likelihood_normalized" or "greedy_token_selection" (likeliest first token,
    ties broken by the next). The scores are kept in the state's meta info. `temperature` is
    SGLang's argument, which its server requires to be 0. Raises InvalidRequest for a missing
    or empty choice list, an unknown method or a temperature other than 0.
    """
    if choices is None:
        raise InvalidRequest("select needs choices=[...]")
    if temperature:
        raise InvalidRequest(f"select scores every choice by its log-probabilities; "
                             f"temperature must be 0, got {temperature!r}")
    return Select(_check_name(name), check_choices(choices),
                  check_method(choices_method if choices_method is not None else method))


def _role_block(role: str, content: NodeLike | None) -> Seq:
    inner = [] if content is None else flatten(content)
    return Seq((RoleBegin(role), *inner, RoleEnd(role)))


def system(content: NodeLike | None = None) -> Seq:
    """A system turn rendered with the model's chat template."""
    return _role_block("system", content)


def user(content: NodeLike | None = None) -> Seq:
    """A user turn rendered with the model's chat template."""
    return _role_block("user", content)


def assistant(content: NodeLike | None = None) -> Seq:
    """An assistant turn; gens inside stop at the template's end-of-turn token."""
    return _role_block("assistant", content)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")
