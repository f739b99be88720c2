"""Tools for `rf.gen(..., tools=[...])`: Python functions or OpenAI tool dicts, turned into the
JSON Schema a call must follow.

A gen with tools generates a JSON list of calls, `[{"name": ..., "arguments": {...}}]`, held
to the tools' names and argument schemas (one call unless parallel calls are allowed); its
variable holds the parsed list, and `rf.call_tools(calls, tools)` runs Python tools on it.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: str  # a JSON Schema, as JSON text (the node stays hashable)
    func: Callable[..., Any] | None = None


def as_tools(tools: Iterable[Any]) -> tuple[Tool, ...]:
    """Python functions (their signature gives the schema) or OpenAI tool dicts, as Tools."""
    if isinstance(tools, (str, dict)) or not isinstance(tools, Iterable):
        raise InvalidRequest(f"tools must be a list of functions or tool dicts, got {tools!r:.80}")
    out = tuple(_as_tool(t) for t in tools)
    if not out:
        raise InvalidRequest("tools is empty")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise InvalidRequest(f"tool names must be unique, got {names}")
    return out


def _as_tool(tool: Any) -> Tool:
    if isinstance(tool, Tool):
        return tool
    if callable(tool):
        return Tool(tool.__name__, json.dumps(_signature_schema(tool)), tool)
    if isinstance(tool, dict):
        spec = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str) and spec["name"]:
            params = spec.get("parameters") or {"type": "object", "properties": {}}
            return Tool(spec["name"], json.dumps(params))
    raise InvalidRequest(f"a tool must be a function or {{'type': 'function', 'function': "
                         f"{{'name': ..., 'parameters': {{...}}}}}}, got {tool!r:.80}")


def _signature_schema(func: Callable[..., Any]) -> dict:
    """The JSON Schema of a function's keyword arguments, from its type hints (pydantic)."""
    from pydantic import create_model

    try:
        hints = typing.get_type_hints(func)  # resolves string annotations
    except Exception as exc:  # noqa: BLE001 -- a hint that does not resolve
        raise InvalidRequest(f"cannot read the type hints of tool {func.__name__}: {exc}") from None
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(name, str)
        fields[name] = (hint, ... if param.default is param.empty else param.default)
    schema = create_model(f"{func.__name__}_arguments", **fields).model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema["additionalProperties"] = False
    return schema


def calls_schema(tools: tuple[Tool, ...], *, parallel: bool) -> str:
    """The JSON Schema (text) of a list of calls of `tools`: at least one, one if not
    `parallel`."""
    call_schemas = [{
        "type": "object",
        "properties": {"name": {"const": t.name}, "arguments": json.loads(t.parameters)},
        "required": ["name", "arguments"], "additionalProperties": False,
    } for t in tools]
    items = call_schemas[0] if len(call_schemas) == 1 else {"anyOf": call_schemas}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return json.dumps(schema)


def call_tools(calls: list[dict], tools: Iterable[Any]) -> list[Any]:
    """Run each call's Python tool with its arguments; the results in call order. Raises
    InvalidRequest for a call of a tool that is not a Python function here."""
    by_name = {t.name: t for t in as_tools(tools)}
    results = []
    for call in calls:
        tool = by_name.get(call.get("name"))
        if tool is None or tool.func is None:
            raise InvalidRequest(f"no Python function for tool {call.get('name')!r}")
        results.append(tool.func(**call.get("arguments", {})))
    return results
