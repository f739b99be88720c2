"""Qwen3-Coder / Qwen3.5 XML tool calls:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

A string parameter is written raw (the template wraps it in newlines, which are not part of
the value); any other value is JSON. The constraint is xgrammar's "qwen_3_coder" structural
tag (its "qwen_xml" style holds each parameter to its schema). The arguments are reported as
JSON, built as the parameters stream: a plain string value streams as it is written, a
constrained one (enum, pattern, format: free whitespace around it) without its surrounding
whitespace, any other value once its </parameter> is there.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...constrained.schema_terms import resolve_ref
from .base import (
    Text,
    ToolParser,
    ToolStream,
    _partial_suffix,
    builtin_tag,
    check_flat_object,
    check_parameters,
    skip_ws,
)

CALL_BEGIN, CALL_END = "<tool_call>", "</tool_call>"
PARAM_END = "</parameter>"
_FUNCTION = re.compile(r"<function=([^>\s]{1,64})>")
_PARAM = re.compile(r"<parameter=([^>\s]+)>")
_NAME = re.compile(r"[^<>=\s\"]+")
_ALL = frozenset({"string", "number", "integer", "boolean", "null", "array", "object"})


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"

    def check(self, plan) -> None:
        for index, tool in enumerate(plan.tools):
            check_flat_object(tool, index, "qwen3_coder", _NAME)

    def constraint(self, plan) -> dict:
        return builtin_tag("qwen_3_coder", plan, "\n")

    def stream(self, plan) -> ToolStream:
        return Qwen3CoderStream(self, plan)

    def call_text(self, name: str, arguments: Any) -> str:
        lines = [CALL_BEGIN, f"<function={name}>"]
        for key, value in (arguments.items() if isinstance(arguments, dict) else []):
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines += [f"<parameter={key}>", text, PARAM_END]
        return "\n".join([*lines, "</function>", CALL_END])


def json_types(schema: Any, root: Any, depth: int = 0) -> frozenset:
    """The JSON types a schema admits (roughly: enough to tell strings from the rest)."""
    if not isinstance(schema, dict) or depth > 16:
        return _ALL
    if isinstance(schema.get("$ref"), str):
        return json_types(resolve_ref(root, schema["$ref"]), root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, str):
        return frozenset({kind})
    if isinstance(kind, list):
        return frozenset(kind)
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return frozenset("string" if isinstance(v, str) else "other" for v in values)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        return frozenset().union(*(json_types(b, root, depth + 1) for b in branches))
    return _ALL


class Param:
    """How one parameter's raw text becomes JSON."""

    def __init__(self, schema: Any, root: Any):
        self.schema = schema if isinstance(schema, dict) else {}
        types = json_types(schema, root)
        self.types = types
        if types != {"string"}:
            self.mode = "whole"
        elif {"minLength", "maxLength"} & self.schema.keys():
            self.mode = "whole"  # the whitespace around it may count toward its length
        elif {"enum", "const", "pattern", "format"} & self.schema.keys():
            self.mode = "trimmed"
        else:
            self.mode = "text"

    def whole(self, raw: str) -> str:
        """The JSON text of a complete value."""
        text = raw.strip()
        if self.types != {"string"}:
            try:
                value = json.loads(text)
            except ValueError:
                value = None
            else:
                if not isinstance(value, str) or "string" not in self.types:
                    return text
        return json.dumps(self._string(raw), ensure_ascii=False)

    def _string(self, raw: str) -> str:
        low = self.schema.get("minLength", 0)
        text = raw.strip()
        if len(text) >= low:
            return text
        start = raw.find(text) if text else len(raw) // 2
        end = start + len(text)
        while end - start < low and (start > 0 or end < len(raw)):  # whitespace it counted
            start, end = (start - 1, end) if start > 0 else (start, end + 1)
        return raw[start:end]


class Qwen3CoderStream(ToolStream):
    openers = (CALL_BEGIN,)

    def _calls_begin(self, opener: str) -> None:
        self.state = "function"  # function, params, value, end
        tools = {t.name: t for t in self.plan.tools}
        self.tools = tools
        self.started = False

    def _call_step(self, final: bool) -> bool:
        return {"function": self._function, "params": self._params, "value": self._value,
                "end": self._end}[self.state](final)

    def _function(self, final: bool) -> bool:
        self.buf = skip_ws(self.buf)
        match = _FUNCTION.match(self.buf)
        if match is None:
            return False
        name = match.group(1)
        self._start_call(name)
        tool = self.tools.get(name)
        self.root = check_parameters(tool, 0) if tool is not None else {}
        self.buf, self.state, self.num_args = self.buf[match.end():], "params", 0
        return True

    def _params(self, final: bool) -> bool:
        self.buf = skip_ws(self.buf)
        if self.buf.startswith("</function>"):
            self._args("}" if self.num_args else "{}")
            self.buf, self.state = self.buf[len("</function>"):], "end"
            return True
        match = _PARAM.match(self.buf)
        if match is None:
            return False
        key = match.group(1)
        schema = (self.root.get("properties") or {}).get(key, {})
        self.param, self.raw, self.lead = Param(schema, self.root), "", True
        self._args(("{" if not self.num_args else ", ") + json.dumps(key, ensure_ascii=False)
                   + ": " + ('"' if self.param.mode != "whole" else ""))
        self.num_args += 1
        self.buf, self.state = self.buf[match.end():], "value"
        return True

    def _value(self, final: bool) -> bool:
        at = self.buf.find(PARAM_END)
        if at < 0:  # keep what may be the start of </parameter>
            hold = 0 if final else _partial_suffix(self.buf, (PARAM_END,))
            piece, self.buf = self.buf[:len(self.buf) - hold], self.buf[len(self.buf) - hold:]
        else:
            piece, self.buf = self.buf[:at], self.buf[at + len(PARAM_END):]
        if self.param.mode != "whole" and self.lead:
            piece = self._lead(piece)
        self.raw += piece
        if at < 0:
            if self.param.mode != "whole":
                body = self._body()
                self._args(json.dumps(body, ensure_ascii=False)[1:-1])
                self.raw = self.raw[len(body):]
            return False
        if self.param.mode == "whole":
            self._args(self.param.whole(self.raw))
        else:
            self._args(json.dumps(self._body(), ensure_ascii=False)[1:-1] + '"')
        self.state = "params"
        return True

    def _body(self) -> str:
        """The streamed value's text but for what may be its trailing whitespace."""
        if self.param.mode == "trimmed":
            return self.raw.rstrip(" \t\r\n")
        return self.raw[:-1] if self.raw.endswith("\n") else self.raw

    def _lead(self, piece: str) -> str:
        if self.param.mode == "trimmed":
            piece = skip_ws(piece)
        elif piece:
            piece = piece[1:] if piece.startswith("\n") else piece
            self.lead = False
            return piece
        self.lead = not piece
        return piece

    def _end(self, final: bool) -> bool:
        rest = skip_ws(self.buf)
        if CALL_END.startswith(rest) and len(rest) < len(CALL_END) and not final:
            return False
        self.buf = rest[len(CALL_END):] if rest.startswith(CALL_END) else rest
        self._leave_calls()
        return True

    def _call_end_of_output(self) -> None:
        if self.state == "function":
            self.out.append(Text(CALL_BEGIN + self.buf))
