"""Pythonic tool calls (Llama 3.2 / Llama 4 pythonic templates, ToolACE): the whole answer
is a Python list of calls with keyword arguments,

    [get_weather(city="Paris", unit="C"), get_time(zone="UTC")]

Values are Python literals: strings in double quotes with JSON's escapes, numbers, True,
False, None, lists and dicts. The constraint is written here: each tool's keyword arguments
follow its parameters schema, properties in their declared order (required ones present), each
value by xgrammar's grammar for its schema with true/false/null written the Python way. The
arguments are reported as JSON: the same text with True/False/None as true/false/null.
"""

from __future__ import annotations

import json
import keyword
import re
from typing import Any

from ...errors import GrammarError
from .base import Text, ToolParser, ToolStream
from .json_calls import skip_ws
from .pythonic_grammar import kwargs_grammar, python_literal
from .schemas import check_flat_object, check_parameters, tool_param
from .tags import called_tools, structural_tag

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALL_HEAD = re.compile(r"([A-Za-z0-9_-]{1,64})\(")
_KWARG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?=\S)")
_PY_TO_JSON = {"True": "true", "False": "false", "None": "null"}


class PythonicParser(ToolParser):
    name = "pythonic"

    def check(self, plan) -> None:
        for index, tool in enumerate(plan.tools):
            schema = check_flat_object(tool, index, "pythonic", _IDENTIFIER)
            for name in schema.get("properties") or {}:
                if keyword.iskeyword(name):
                    raise GrammarError(f"{tool_param(index)} (tool {tool.name!r}): property "
                                       f"{name!r} at #/properties/{name} is a Python keyword, "
                                       "which pythonic tool calls cannot name",
                                       param=tool_param(index))
            try:
                kwargs_grammar(json.dumps(schema))
            except (RuntimeError, ValueError) as exc:
                raise GrammarError(f"{tool_param(index)} (tool {tool.name!r}): {exc}",
                                   param=tool_param(index)) from None

    def constraint(self, plan) -> dict:
        tags = []
        for tool in called_tools(plan):
            schema = check_parameters(tool, plan.tools.index(tool))
            grammar = kwargs_grammar(json.dumps(schema))
            content = ({"type": "grammar", "grammar": grammar} if grammar
                       else {"type": "const_string", "value": ""})
            tags.append({"type": "tag", "begin": f"{tool.name}(", "content": content,
                         "end": ")"})
        calls = {"type": "tags_with_separator", "tags": tags, "separator": ", ",
                 "at_least_one": True,
                 "stop_after_first": not plan.parallel or plan.mode == "named"}
        listed = {"type": "sequence", "elements": [
            {"type": "const_string", "value": "["}, calls, {"type": "const_string", "value": "]"}]}
        if plan.mode != "auto":
            return structural_tag(listed)
        text = {"type": "sequence", "elements": [  # text, which cannot start like a list
            {"type": "regex", "pattern": r"[^\[\s]"}, {"type": "any_text"}]}
        return structural_tag({"type": "or", "elements": [listed, text]})

    def stream(self, plan) -> ToolStream:
        return PythonicStream(self, plan)

    def call_text(self, name: str, arguments: Any) -> str:
        if not isinstance(arguments, dict):
            return f"[{name}()]"
        kwargs = ", ".join(f"{k}={python_literal(v)}" for k, v in arguments.items())
        return f"[{name}({kwargs})]"


# ---- parsing ----

class PythonicStream(ToolStream):
    """A list of calls at the start of the output, else text."""

    def __init__(self, parser, plan):
        super().__init__(parser, plan)
        self.decided = False
        self.state = "head"  # head, key, value, after_value, after_call
        self.value: PyValue | None = None
        self.num_args = 0

    def _calls_begin(self, opener: str) -> None:
        """Unused: the list is recognized by _text_step."""

    def _text_step(self, final: bool) -> bool:
        if self.decided:
            return super()._text_step(final)
        rest = skip_ws(self.buf)
        if not rest and not final:
            return False
        self.decided = True
        if rest.startswith("["):
            self.buf, self.in_calls = rest[1:], True
        return True

    def _call_step(self, final: bool) -> bool:
        step = {"head": self._head, "key": self._key, "value": self._value,
                "after_value": self._after, "after_call": self._after}[self.state]
        return step(final)

    def _head(self, final: bool) -> bool:
        self.buf = skip_ws(self.buf)
        match = _CALL_HEAD.match(self.buf)
        if match is None:
            return False
        self._start_call(match.group(1))
        self.buf, self.state, self.num_args = self.buf[match.end():], "key", 0
        return True

    def _key(self, final: bool) -> bool:
        self.buf = skip_ws(self.buf)
        if self.buf.startswith(")"):
            return self._close_call()
        match = _KWARG.match(self.buf)
        if match is None:
            return False
        self._args(("{" if not self.num_args else ", ") + json.dumps(match.group(1)) + ": ")
        self.num_args += 1
        self.buf, self.state, self.value = self.buf[match.end():], "value", PyValue()
        return True

    def _value(self, final: bool) -> bool:
        used, ended, text = self.value.scan(self.buf, final)
        self._args(text)
        self.buf = self.buf[used:]
        if ended:
            self.state = "after_value"
        return ended

    def _after(self, final: bool) -> bool:
        rest = skip_ws(self.buf)
        if not rest:
            self.buf = rest
            return False
        self.buf = rest[1:]
        if rest[0] == "," and self.state == "after_value":
            self.state = "key"
        elif rest[0] == "," and self.state == "after_call":
            self.state = "head"
        elif rest[0] == ")" and self.state == "after_value":
            self.buf = rest
            return self._close_call()
        else:  # "]" ends the list (or something else: text)
            self.buf = rest if rest[0] != "]" else rest[1:]
            self._leave_calls()
        return True

    def _close_call(self) -> bool:
        self._args("}" if self.num_args else "{}")
        self.buf, self.state = self.buf[1:], "after_call"
        return True

    def _call_end_of_output(self) -> None:
        if self.num_calls == 0:
            self.out.append(Text("[" + self.buf))


class PyValue:
    """One Python literal argument, converted to JSON as it streams: it ends before a ',' or
    ')' outside brackets and strings; True/False/None wait until the word is complete."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escaped = False
        self.word = ""

    def scan(self, text: str, final: bool) -> tuple[int, bool, str]:
        """(chars of `text` used, whether the value ended, its JSON text so far)."""
        out = []
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                out.append(ch)
                continue
            if ch.isalpha() or (self.word and ch.isalnum()):
                self.word += ch
                continue
            out.append(self._flush())
            if self.depth == 0 and ch in ",)":
                return i, True, "".join(out)
            self.depth += (ch in "[{") - (ch in "]}")
            self.in_string = ch == '"'
            out.append(ch)
        if final:
            out.append(self._flush())
        return len(text), False, "".join(out)

    def _flush(self) -> str:
        word, self.word = self.word, ""
        return _PY_TO_JSON.get(word, word)
