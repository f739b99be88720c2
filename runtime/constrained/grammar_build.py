"""Turns a validated constraint (kind, spec) into an xgrammar grammar, then compiles it."""

from __future__ import annotations

import json
import logging

import xgrammar as xgr

from ..errors import GrammarError
from .limits import GrammarLimits, parse_choices, parse_structural_tag
from .regex_check import normalize_regex
from .unicode_fix import fix_printed_grammar

logger = logging.getLogger(__name__)

# NOTE: JSON is compiled without free whitespace: a small model given any_whitespace tends to
# emit endless newlines, and fixed separators make keys and punctuation jump-forward-able.
JSON_SEPARATORS = (", ", ": ")


def compile_constraint(compiler: xgr.GrammarCompiler, kind: str, spec: str,
                       limits: GrammarLimits) -> xgr.CompiledGrammar:
    """Compile; xgrammar's own errors become GrammarError carrying its message."""
    try:
        return compiler.compile_grammar(build_grammar(kind, spec, limits))
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"cannot compile {kind}: {_xgrammar_message(exc)}",
                           param=_param(kind)) from None


def build_grammar(kind: str, spec: str, limits: GrammarLimits) -> xgr.Grammar:
    """The grammar for a constraint, before tokenizer-specific compilation."""
    if kind == "regex":
        grammar = xgr.Grammar.from_regex(normalize_regex(spec))
    elif kind == "json_schema":
        grammar = xgr.Grammar.from_json_schema(spec, any_whitespace=False,
                                               separators=JSON_SEPARATORS, strict_mode=True)
    elif kind == "json_object":
        grammar = xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False,
                                               separators=JSON_SEPARATORS)
    elif kind == "ebnf":
        grammar = xgr.Grammar.from_ebnf(spec)
    elif kind == "choices":
        return xgr.Grammar.from_ebnf(choices_to_ebnf(parse_choices(spec, limits)))
    elif kind == "structural_tag":
        grammar = xgr.Grammar.from_structural_tag(json.dumps(parse_structural_tag(spec, limits)))
    else:
        raise GrammarError(f"unknown constraint kind {kind!r}")
    return _well_formed(grammar)


def choices_to_ebnf(choices: list[str]) -> str:
    """A grammar matching exactly one of `choices` (EBNF literals use JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _well_formed(grammar: xgr.Grammar) -> xgr.Grammar:
    text = str(grammar)
    fixed = fix_printed_grammar(text)
    if fixed == text:
        return grammar
    try:
        return xgr.Grammar.from_ebnf(fixed)
    except RuntimeError as exc:
        logger.warning("grammar rewrite failed (%s); compiling it unchanged", exc)
        return grammar


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
