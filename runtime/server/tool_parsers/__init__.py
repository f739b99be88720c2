"""Tool-call formats: one parser per format, chosen by --tool-call-parser or from the chat
template.

    name          writes calls as                                      models
    hermes        <tool_call>{"name": ..., "arguments": ...}</tool_call>  Hermes, Qwen2.5, Qwen3
    llama3        {"name": ..., "parameters": ...}                      Llama 3.1 / 3.2 / 3.3
    mistral       [TOOL_CALLS][{"name": ..., "arguments": ...}]         Mistral v0.3, Nemo, Small
                  (or [TOOL_CALLS]name[ARGS]{...})                      3.2, Devstral, Magistral
    pythonic      [f(a=1), g(b="x")]                                    Llama 3.2 / 4 pythonic
    qwen3_coder   <tool_call><function=f><parameter=a>1</parameter>...  Qwen3-Coder, Qwen3.5

vLLM's and SGLang's names for the same formats are accepted too (ALIASES). The names and
where each parser lives are in runtime/tool_call_formats.py, a leaf ServerArgs reads.
"""

from __future__ import annotations

import importlib

from ...tool_call_formats import ALIASES, DEFAULT, PARSERS, check_parser_name
from .base import ArgsDelta, CallStart, Event, Text, ToolParser, ToolStream

# Marks of each format in a chat template (all of the first, none of the second), most
# specific first: Qwen3-Coder's template also holds <tool_call>, and GLM's XML calls sit in
# <tool_call> tags with <arg_key>s.
_TEMPLATE_MARKS = (
    ("qwen3_coder", ("<tool_call>", "<function=", "<parameter="), ()),
    ("mistral", ("[TOOL_CALLS]",), ()),
    ("hermes", ("<tool_call>", '"name"', '"arguments"'), ("<function=", "<arg_key>")),
    ("llama3", ('"parameters": dictionary of argument name',), ()),
    ("pythonic", ("[func_name1(",), ()),
)

__all__ = ["ALIASES", "DEFAULT", "PARSERS", "ArgsDelta", "CallStart", "Event", "Text",
           "ToolParser", "ToolStream", "check_parser_name", "choose_parser", "get_parser"]


def get_parser(name: str, template: str | None = None) -> ToolParser:
    module, cls = PARSERS[check_parser_name(name)].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(template)


def choose_parser(template: str | None, name: str | None = None) -> tuple[ToolParser, str]:
    """The parser for a server: `name` (--tool-call-parser) if given, else the format the
    chat template shows when exactly one matches, else hermes. Returns (parser, why)."""
    if name is not None:
        return get_parser(name, template), "--tool-call-parser"
    found = detect_formats(template)
    if len(found) == 1:
        return get_parser(found[0], template), "the chat template"
    why = ("the chat template shows no known tool-call format" if not found else
           f"the chat template matches several formats ({', '.join(found)}); "
           "pass --tool-call-parser")
    return get_parser(DEFAULT, template), f"the default: {why}"


def detect_formats(template: str | None) -> list[str]:
    """The formats whose marks `template` holds."""
    text = template or ""
    return [name for name, marks, absent in _TEMPLATE_MARKS
            if all(m in text for m in marks) and not any(m in text for m in absent)]
