"""The cheap checks of the kinds that need no analysis: an EBNF grammar (xgrammar parses it
when it compiles, and names any error there) and a list of choices (compiled as EBNF)."""

from __future__ import annotations

import json
import re

from ..errors import GrammarError
from .limits import GrammarLimits

_EBNF_RULE = re.compile(r"^[ \t]*[A-Za-z_][A-Za-z0-9_.-]*[ \t]*::=", re.MULTILINE)


def check_ebnf(spec: str, max_length: int, max_rules: int = 1000) -> None:
    """Cheap checks (xgrammar parses the grammar when it compiles, and names any error)."""
    if not isinstance(spec, str) or not spec.strip():
        raise GrammarError("ebnf must be a non-empty grammar string", param="ebnf")
    if len(spec) > max_length:
        raise GrammarError(f"ebnf is {len(spec)} characters long; the limit is {max_length}",
                           param="ebnf")
    if "::=" not in spec:
        raise GrammarError("ebnf defines no rule (expected `root ::= ...`)", param="ebnf")
    rules = len(_EBNF_RULE.findall(spec))
    if rules > max_rules:
        raise GrammarError(f"ebnf defines {rules} rules; the limit is {max_rules} "
                           "(max_ebnf_rules)", param="ebnf")


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


def choices_to_ebnf(choices: list[str]) -> str:
    """A grammar matching exactly one of `choices` (EBNF literals use JSON string escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
