"""Validation of a constraint (kind, spec) before compilation, with limits against grammar
bombs. Pure Python + interegular, so the HTTP process can reject a bad request with a 400
before it reaches the scheduler."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import GrammarError
from .regex_check import RegexLimits, check_regex
from .schema_check import SchemaLimits, parse_json_schema

KINDS = ("regex", "json_schema", "json_object", "ebnf", "choices")


@dataclass(frozen=True)
class GrammarLimits:
    regex: RegexLimits = field(default_factory=RegexLimits)
    schema: SchemaLimits = field(default_factory=SchemaLimits)
    max_ebnf_length: int = 64 * 1024
    max_choices: int = 1024
    max_choices_chars: int = 64 * 1024  # all choices together


def validate_constraint(kind: str, spec: str, limits: GrammarLimits | None = None) -> None:
    """Raise GrammarError (a 400) if the constraint is invalid, unsupported or too big.

    kind is one of KINDS; spec is the regex, the schema as a JSON string, the EBNF grammar, or
    the choices as a JSON list of strings (spec is ignored for "json_object").
    """
    limits = limits or GrammarLimits()
    if kind == "regex":
        check_regex(spec, limits.regex)
    elif kind == "json_schema":
        parse_json_schema(spec, limits.schema, limits.regex)
    elif kind == "json_object":
        return
    elif kind == "ebnf":
        check_ebnf(spec, limits.max_ebnf_length)
    elif kind == "choices":
        parse_choices(spec, limits)
    else:
        raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")


def check_ebnf(spec: str, max_length: int) -> None:
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError("ebnf must be a non-empty grammar string", param="ebnf")
    if len(spec) > max_length:
        raise GrammarError(f"ebnf is {len(spec)} characters long; the limit is {max_length}",
                           param="ebnf")


def parse_choices(spec: str, limits: GrammarLimits) -> list[str]:
    """The choices of a `choices` spec (a JSON list of non-empty strings)."""
    try:
        choices = json.loads(spec) if isinstance(spec, str) else None
    except ValueError:
        choices = None
    if (not isinstance(choices, list) or not choices
            or not all(isinstance(c, str) and c for c in choices)):
        raise GrammarError("choices must be a non-empty list of non-empty strings",
                           param="choices")
    if len(choices) > limits.max_choices:
        raise GrammarError(f"{len(choices)} choices given; the limit is {limits.max_choices}",
                           param="choices")
    total = sum(len(c) for c in choices)
    if total > limits.max_choices_chars:
        raise GrammarError(f"the choices hold {total} characters; the limit is "
                           f"{limits.max_choices_chars}", param="choices")
    return choices
