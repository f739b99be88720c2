"""The structural tags that hold a format's output to its tools' schemas."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..openai_tools import Tool, ToolPlan

# Consecutive whitespace allowed in a call's arguments (a tiny or confused model otherwise
# writes newlines until max_tokens): what compact JSON and the XML layouts need ("\r\n").
MAX_WHITESPACE = 2


def structural_tag(fmt: Any) -> dict:
    """The sampling fields of a structural tag format (a pydantic model or a dict)."""
    if hasattr(fmt, "model_dump"):
        fmt = fmt.model_dump(mode="json")
    tag = fmt if fmt.get("type") == "structural_tag" else {"type": "structural_tag",
                                                            "format": fmt}
    return {"structural_tag": json.dumps(tag, ensure_ascii=False)}


def builtin_tag(model: str, plan: ToolPlan, separator: str) -> dict:
    """xgrammar's structural tag for `model`'s format (reasoning left to --reasoning-parser,
    which engages a constraint after the thinking). For tool_choice "required" the output is
    the calls alone, `separator` between them (xgrammar's lets text follow the first)."""
    from xgrammar.builtin_structural_tag import get_model_structural_tag

    tools = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}}
             for t in plan.tools]
    choice: Any = plan.mode
    if plan.mode == "named":
        choice = {"type": "function", "function": {"name": plan.named.name}}
    tag = get_model_structural_tag(model, tools=tools, tool_choice=choice, reasoning="disabled",
                                   parallel_tool_calls=plan.parallel,
                                   max_whitespace_cnt=MAX_WHITESPACE).model_dump(mode="json")
    fmt = tag["format"]
    if plan.mode == "required" and fmt.get("type") == "triggered_tags":
        tag["format"] = {"type": "tags_with_separator", "tags": fmt["tags"],
                         "separator": separator, "at_least_one": True,
                         "stop_after_first": not plan.parallel}
    return structural_tag(tag)


def schema_format(schema: dict, **extra: Any) -> dict:
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE,
            **extra}


def called_tools(plan: ToolPlan) -> list[Tool]:
    return [plan.named] if plan.mode == "named" else plan.tools

