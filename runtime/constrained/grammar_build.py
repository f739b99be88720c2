"""Turns a prepared Constraint into an xgrammar grammar, then compiles it. The spec is compiled
as the front door left it: nothing here checks or rewrites it again."""

from __future__ import annotations

import logging

import xgrammar as xgr

from ..errors import GrammarError
from .constraint import Constraint
from .xgrammar_compat import fix_printed_grammar

logger = logging.getLogger(__name__)

# NOTE: JSON is compiled without free whitespace: a small model given any_whitespace tends to
# emit endless newlines, and fixed separators make keys and punctuation jump-forward-able.
JSON_SEPARATORS = (", ", ": ")


def compile_constraint(compiler: xgr.GrammarCompiler,
                       constraint: Constraint) -> xgr.CompiledGrammar:
    """Compile; xgrammar's own errors become GrammarError carrying its message."""
    kind = constraint.kind
    try:
        return compiler.compile_grammar(build_grammar(kind, constraint.spec))
    except GrammarError:
        raise
    except (RuntimeError, ValueError, TypeError) as exc:
        raise GrammarError(f"cannot compile {kind}: {xgrammar_message(exc)}",
                           param=_param(kind)) from None


def build_grammar(kind: str, spec: str) -> xgr.Grammar:
    """The grammar for a normalised spec (Constraint.spec), before tokenizer-specific
    compilation."""
    if kind == "regex":
        grammar = xgr.Grammar.from_regex(spec)
    elif kind == "json_schema":
        grammar = json_schema_grammar(spec)
    elif kind == "json_object":
        grammar = xgr.Grammar.from_json_schema(spec, any_whitespace=False,
                                               separators=JSON_SEPARATORS)
    elif kind in ("ebnf", "choices"):
        grammar = xgr.Grammar.from_ebnf(spec)
        if kind == "choices":  # plain literals: nothing for unicode_fix to do
            return grammar
    elif kind == "structural_tag":
        grammar = xgr.Grammar.from_structural_tag(spec)
    else:
        raise GrammarError(f"unknown constraint kind {kind!r}")
    return _well_formed(grammar)


def json_schema_grammar(spec: str) -> xgr.Grammar:
    """xgrammar's grammar for a checked schema, as radixflow compiles JSON (JSON_SEPARATORS,
    strict), before unicode_fix."""
    return xgr.Grammar.from_json_schema(spec, any_whitespace=False, separators=JSON_SEPARATORS,
                                        strict_mode=True)


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


def xgrammar_message(exc: Exception) -> str:
    """xgrammar prefixes messages with '[time] /path/file.cc:line: '; keep what follows."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if first.startswith("[") and ": " in first:
        first = first.split(": ", 1)[1]
        if first.startswith("Check failed:") and "is false: " in first:
            first = first.split("is false: ", 1)[1]
    return first
