"""What a sampling option is: its type, its allowed values, and how the wire spells a value.

`SamplingParams` (sampling_params.py) declares each option as a field made by `option(...)`;
`validate()` and `from_dict()` read these descriptions, and so do the surfaces that declare
their own bounds (the OpenAI request models take theirs from `Range.schema_bounds`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest

# A structured option's check: (field name, value of any type) -> the value, normalised.
Check = Callable[[str, Any], Any]


def bad_value(name: str, value: Any, why: str) -> InvalidRequest:
    """The error naming `name`: "<name> <why> (got <value>)"."""
    return InvalidRequest(f"{name} {why} (got {value!r})", param=name)


@dataclass(frozen=True)
class Range:
    """The values lo..hi (None: unbounded; an open end excludes itself), plus `also`, and
    the words an error uses for them."""

    lo: float | None
    hi: float | None
    why: str
    lo_open: bool = False
    hi_open: bool = False
    also: tuple[float, ...] = ()  # single values allowed outside lo..hi (-1: disabled)

    def holds(self, x: float) -> bool:
        if x in self.also:
            return True
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)

    def schema_bounds(self) -> dict[str, float]:
        """The bounds a schema (pydantic's ge/gt/le/lt) can state: the smallest interval
        holding every allowed value."""
        bounds: dict[str, float] = {}
        if self.lo is not None:
            lo = min(self.lo, *self.also) if self.also else self.lo
            bounds["gt" if self.lo_open and lo == self.lo else "ge"] = lo
        if self.hi is not None:
            hi = max(self.hi, *self.also) if self.also else self.hi
            bounds["lt" if self.hi_open and hi == self.hi else "le"] = hi
        return bounds


def interval(text: str) -> Range:
    """`interval("(0, 1]")`: the interval as a mathematician writes it."""
    lo, hi = (_number(part.strip()) for part in text[1:-1].split(","))
    return Range(lo, hi, f"must be in {text}", lo_open=text[0] == "(", hi_open=text[-1] == ")")


def _number(text: str) -> float:
    return int(text) if text.lstrip("-").isdigit() else float(text)


def between(lo: int, hi: int) -> Range:
    return Range(lo, hi, f"must be between {lo} and {hi}")


def at_least(lo: int) -> Range:
    return Range(lo, None, f"must be >= {lo}")


_KIND_WORDS = {int: "int", float: "int/float", bool: "bool", str: "a string"}


@dataclass(frozen=True)
class Option:
    """How one SamplingParams field is checked and read off the wire."""

    kind: type | None  # int, float (which takes ints), bool or str; None: `check` does it all
    rule: Range | None = None  # the allowed values of that kind
    check: Check | None = None  # a structured value's whole check
    wire: Callable[[Any], Any] | None = None  # from_dict's reading of a wire value
    nullable: bool = False  # None is a value (the option is off)

    def read(self, value: Any) -> Any:
        """A wire value as the field holds it (the check comes later)."""
        return value if self.wire is None else self.wire(value)

    def check_type(self, name: str, value: Any) -> None:
        if self.kind is None or (value is None and self.nullable):
            return
        types = (int, float) if self.kind is float else (self.kind,)
        if not isinstance(value, types) or (isinstance(value, bool) and self.kind is not bool):
            raise bad_value(name, value, f"must be {_KIND_WORDS[self.kind]}")

    def check_value(self, name: str, value: Any) -> Any:
        """`value` (of the right type) checked; returned as the field holds it."""
        if value is None and self.nullable:
            return None
        if self.check is not None:
            return self.check(name, value)
        if self.kind is float:
            value = float(value)
        if self.rule is not None and not self.rule.holds(value):
            raise bad_value(name, value, self.rule.why)
        return value

    def checked(self, name: str, value: Any) -> Any:
        self.check_type(name, value)
        return self.check_value(name, value)


def option(default: Any, kind: type | None = None, rule: Range | None = None, *,
           check: Check | None = None, wire: Callable[[Any], Any] | None = None) -> Any:
    """A SamplingParams field: `default` ([] makes a fresh list each time) and its Option."""
    described = {"option": Option(kind, rule, check, wire, nullable=default is None)}
    if isinstance(default, list) and not default:
        return dataclasses.field(default_factory=list, metadata=described)
    return dataclasses.field(default=default, metadata=described)


# ---- wire readers ----

def one_or_list(value: Any) -> Any:
    """A string stands for a list of one."""
    return [value] if isinstance(value, str) else value


def json_text(value: Any) -> Any:
    """A JSON document sent as an object is kept as its text."""
    return json.dumps(value) if isinstance(value, dict) else value


def token_id_keys(bias: Any) -> Any:
    """logit_bias with its keys as ints: JSON (and OpenAI) sends them as strings ("50256")."""
    if not isinstance(bias, dict):
        return bias
    out: dict = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str):
            digits = key.strip()
            if not digits.isascii() or not digits.isdigit():
                raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}",
                                     param="logit_bias")
            token = int(digits)
        if token in out:
            raise InvalidRequest(f"logit_bias gives token {token} more than once",
                                 param="logit_bias")
        out[token] = value
    return out


# ---- checks of structured options ----

def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def strings(*, at_most: int) -> Check:
    """A list of at most `at_most` non-empty strings (stop strings)."""

    def check(name: str, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise bad_value(name, value, "must be a string or a list of strings")
        if any(s == "" for s in value):
            raise bad_value(name, value, "must not contain empty strings")
        if len(value) > at_most:
            raise bad_value(name, value, f"may hold at most {at_most} strings")
        return value

    return check


def choice_list(name: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(
            isinstance(c, str) and c for c in value):
        raise bad_value(name, value, "must be a non-empty list of non-empty strings")
    return value


def token_ids(name: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not all(_is_token_id(t) for t in value):
        raise bad_value(name, value, "must be a list of non-negative ints")
    return value


def stop_patterns(*, at_most: int, max_len: int) -> Check:
    """At most `at_most` regexes of at most `max_len` characters, none matching ""."""

    def check(name: str, patterns: Any) -> list[str]:
        import regex

        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise InvalidRequest(f"{name} must be a string or a list of strings "
                                 f"(got {patterns!r})", param=name)
        if len(patterns) > at_most:
            raise InvalidRequest(f"{name} may hold at most {at_most} patterns", param=name)
        for pattern in patterns:
            if len(pattern) > max_len:
                raise InvalidRequest(f"a {name} pattern may be at most {max_len} characters "
                                     f"(got {len(pattern)})", param=name)
            try:
                compiled = regex.compile(pattern)
            except (regex.error, ValueError, OverflowError) as exc:
                raise InvalidRequest(f"{name} {pattern!r} is not a valid regex: {exc}",
                                     param=name) from None
            if compiled.fullmatch("") is not None:
                raise InvalidRequest(f"{name} {pattern!r} matches the empty string", param=name)
        return patterns

    return check


def token_biases(*, at_most: int, limit: float) -> Check:
    """Token id -> a number in [-limit, limit]; at most `at_most` of them."""

    def check(name: str, bias: Any) -> dict[int, float]:
        if not isinstance(bias, dict):
            raise InvalidRequest(f"{name} must be an object mapping token ids to numbers "
                                 f"(got {bias!r})", param=name)
        if len(bias) > at_most:
            raise InvalidRequest(f"{name} may hold at most {at_most} tokens "
                                 f"(got {len(bias)})", param=name)
        for token, value in bias.items():
            if not _is_token_id(token):
                raise InvalidRequest(f"{name} keys must be token ids (non-negative ints), "
                                     f"got {token!r}", param=name)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not -limit <= value <= limit):
                raise InvalidRequest(f"{name} of token {token} must be a number in "
                                     f"[{-limit:g}, {limit:g}] (got {value!r})", param=name)
        return {token: float(value) for token, value in bias.items()}

    return check
