"""Turns a validated constraint (kind, spec) into an xgrammar CompiledGrammar."""

from __future__ import annotations

import json

import xgrammar as xgr

from ..errors import GrammarError
from .limits import GrammarLimits, parse_choices
from .regex_check import normalize_regex

# NOTE: JSON is compiled without free whitespace: a small model given any_whitespace tends to
# emit endless newlines, and fixed separators make keys and punctuation jump-forward-able.
JSON_SEPARATORS = (", ", ": ")


def compile_constraint(compiler: xgr.GrammarCompiler, kind: str, spec: str,
                       limits: GrammarLimits) -> xgr.CompiledGrammar:
    """Compile; xgrammar's own errors become GrammarError carrying its message."""
    try:
        if kind == "regex":
            return compiler.compile_regex(normalize_regex(spec))
        if kind == "json_schema":
            return compiler.compile_json_schema(
                spec, any_whitespace=False, separators=JSON_SEPARATORS, strict_mode=True)
        if kind == "json_object":
            return compiler.compile_json_schema(
                '{"type": "object"}', any_whitespace=False, separators=JSON_SEPARATORS)
        if kind == "ebnf":
            return compiler.compile_grammar(spec)
        if kind == "choices":
            return compiler.compile_grammar(choices_to_ebnf(parse_choices(spec, limits)))
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"cannot compile {kind}: {_xgrammar_message(exc)}",
                           param=_param(kind)) from None
    raise GrammarError(f"unknown constraint kind {kind!r}")


def choices_to_ebnf(choices: list[str]) -> str:
    """A grammar matching exactly one of `choices` (EBNF literals use JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _param(kind: str) -> str:
    return "json_schema" if kind == "json_object" else kind


def _xgrammar_message(exc: Exception) -> str:
    """xgrammar prefixes messages with '[time] /path/file.cc:line: '; keep what follows."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if first.startswith("[") and ": " in first:
        first = first.split(": ", 1)[1]
        if first.startswith("Check failed:") and "is false: " in first:
            first = first.split("is false: ", 1)[1]
    return first
