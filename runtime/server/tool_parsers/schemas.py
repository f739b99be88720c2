"""The checks of a tool's parameters schema: through the constraint front door, as a
json_schema constraint is checked, with refusals naming the tool."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from ...constrained import prepare
from ...errors import GrammarError

if TYPE_CHECKING:
    from ..openai_tools import Tool

# Schema keywords that only annotate (allowed anywhere a format checks keywords).
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "examples",
                         "default", "deprecated", "readOnly", "writeOnly"})


def tool_param(index: int) -> str:
    return f"tools.{index}.function.parameters"


def check_parameters(tool: Tool, index: int) -> dict:
    """The tool's parameters schema checked and rewritten as a json_schema constraint is (the
    front door's cache: the structural tag that holds the calls to it finds it prepared); a
    refusal names the tool, the keyword and its path."""
    try:
        prepared = prepare("json_schema", json.dumps(tool.parameters))
    except GrammarError as exc:
        raise GrammarError(f"{tool_param(index)} (tool {tool.name!r}): {exc.message}",
                           param=tool_param(index)) from None
    return json.loads(prepared.spec)


def check_flat_object(tool: Tool, index: int, fmt: str, name_ok: re.Pattern) -> dict:
    """For formats that write each argument by name (XML, pythonic): the top level must be
    an object of named properties. Returns the checked, rewritten schema."""
    schema = check_parameters(tool, index)

    def refuse(keyword: str, why: str) -> GrammarError:
        return GrammarError(f"{tool_param(index)} (tool {tool.name!r}): '{keyword}' at "
                            f"#/{keyword} {why} in {fmt} tool calls, which write each "
                            "argument by name", param=tool_param(index))

    if schema.get("type", "object") != "object":
        raise refuse("type", "must be \"object\"")
    allowed = {"type", "properties", "required", "additionalProperties", "$defs",
               "definitions"} | ANNOTATIONS
    for keyword in sorted(set(schema) - allowed):
        raise refuse(keyword, "is not supported at the top level")
    if schema.get("additionalProperties", False) not in (False, None):
        raise refuse("additionalProperties", "must be false (or absent)")
    for name in schema.get("properties") or {}:
        if not name_ok.fullmatch(name):
            raise refuse(f"properties/{name}", "is not a name the format can write")
    return schema
