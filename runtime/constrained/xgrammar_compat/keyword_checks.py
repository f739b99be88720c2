"""The refusals of one JSON Schema node: every keyword whose xgrammar mask is not exact is
refused with a GrammarError naming it and its JSON path, so that every output the masks allow
validates. The walker (schema_walk.py) calls these in a fixed order, so a schema with several
problems is told about the same one first, every time."""

from __future__ import annotations

import json
import re
from typing import Any

from ..limits import RegexLimits
from ..regex_check import check_regex
from ..schema_errors import refuse, unsupported
from ..schema_terms import ASSERTIONS, assertions, listed_values
from .gaps import (
    FORMAT_GAPS,
    MAX_MULTIPLE_OF,
    MAX_MULTIPLE_OF_RANGE,
    PROPERTY_NAME_KEYWORDS,
    SUPPORTED_FORMATS,
    UNENFORCED_KEYWORDS,
)


def check_value_keywords(node: dict, path: str, regex_limits: RegexLimits) -> None:
    """The keywords about the value itself: unenforced ones, uniqueItems, multipleOf, type,
    enum/const, and the string keywords."""
    for key, what in UNENFORCED_KEYWORDS.items():
        if key in node:
            raise unsupported(key, path, what)
    if node.get("uniqueItems") is True:
        raise unsupported("uniqueItems", path, "uniqueItems")
    if "multipleOf" in node:
        _check_multiple_of(node, path)
    if node.get("type") == []:
        raise refuse("type", path, "is an empty list, which admits no value")
    _check_listed(node, path)
    _check_strings(node, path, regex_limits)


def check_ref_siblings(node: dict, path: str) -> None:
    siblings = assertions(node, "$ref")
    if siblings:
        raise refuse("$ref", path, f"has siblings ({', '.join(siblings)}) that xgrammar "
                     "ignores; move them into the referenced schema")


def check_combinators(node: dict, path: str) -> None:
    """allOf beyond one subschema, and anyOf/oneOf beside other keywords (the oneOf overlap
    is one_of.py's)."""
    if isinstance(node.get("allOf"), list) and (
            len(node["allOf"]) > 1 or assertions(node, "allOf")):
        raise unsupported("allOf", path, "allOf with several subschemas or beside "
                          "other keywords; merge them into one schema")
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list) and assertions(node, key):
            raise refuse(key, path, f"has siblings ({', '.join(assertions(node, key))}) "
                         "that xgrammar ignores; repeat them in every branch")


def one_of_overlap_error(path: str, i: int, j: int) -> Exception:
    return refuse("oneOf", path, f"has branches {i} and {j} that a value may match both of, "
                  "and xgrammar reads oneOf as anyOf; make the branches disjoint (other types, "
                  "other const values of a required property, ranges that do not meet) or use "
                  "anyOf")


def _check_multiple_of(node: dict, path: str) -> None:
    step = node["multipleOf"]
    if node.get("type") != "integer":
        raise unsupported("multipleOf", path, "multipleOf without type integer")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= MAX_MULTIPLE_OF:
        raise unsupported("multipleOf", path,
                          f"multipleOf other than an integer in 1..{MAX_MULTIPLE_OF}")
    low = _bound(node, "minimum", "exclusiveMinimum", +1)
    high = _bound(node, "maximum", "exclusiveMaximum", -1)
    if low is None and high is None:
        return
    if low is None or high is None or high - low + 1 > MAX_MULTIPLE_OF_RANGE:
        raise unsupported("multipleOf", path, f"multipleOf with a range that is one-sided or "
                          f"spans more than {MAX_MULTIPLE_OF_RANGE} integers")



def _bound(node: dict, inclusive: str, exclusive: str, step: int) -> float | None:
    """The tightest inclusive integer bound on one side, or None."""
    candidates = []
    if isinstance(node.get(inclusive), (int, float)):
        candidates.append(node[inclusive])
    if isinstance(node.get(exclusive), (int, float)):
        candidates.append(node[exclusive] + step)
    if not candidates:
        return None
    return max(candidates) if step > 0 else min(candidates)



def _check_listed(node: dict, path: str) -> None:
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise refuse("enum", path, "must be a non-empty list")
    siblings = assertions(node, "enum", "const")
    for key in ("enum", "const"):
        if key in node and siblings:
            raise refuse(key, path, f"has siblings ({', '.join(siblings)}) that xgrammar "
                         f"ignores (it emits every listed value); list only the values that "
                         f"satisfy them")


def _check_strings(node: dict, path: str, regex_limits: RegexLimits) -> None:
    fmt = node.get("format")
    if fmt is not None and not (isinstance(fmt, str) and fmt in SUPPORTED_FORMATS):
        why = FORMAT_GAPS.get(fmt, "is not a format that constrained decoding checks") if \
            isinstance(fmt, str) else "must be a string"
        raise refuse("format", path, f"{fmt!r}: {why}; supported: "
                     f"{', '.join(sorted(SUPPORTED_FORMATS))}")
    if fmt is not None and "pattern" in node:
        raise refuse("format", path, "is beside a pattern, and xgrammar drops the pattern; "
                     "put the format's shape into the pattern")
    if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
        raise unsupported("minLength" if "minLength" in node else "maxLength", path,
                          "minLength/maxLength together with pattern or format; put the "
                          "length bound into the pattern")
    pattern = node.get("pattern")
    if pattern is not None:
        check_regex(pattern, regex_limits, param="json_schema", what=f"pattern at {path}")


def check_object(node: dict, path: str) -> None:
    props = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise refuse("required", path, "must be a list of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise refuse("required", path, f"names {', '.join(map(repr, missing))}, which "
                     "'properties' does not declare, and xgrammar then never writes it; "
                     "declare it")
    extra = next((k for k in ("additionalProperties", "unevaluatedProperties") if k in node),
                 None)
    open_extra = extra is not None and node[extra] is not False
    patterns = node.get("patternProperties")
    if patterns:
        _check_pattern_properties(node, path, props)
    if patterns and props and open_extra:
        raise refuse(extra, path, "is beside properties and patternProperties, where "
                     "xgrammar writes extra keys that may be a declared name or match a "
                     "pattern, unchecked by their schemas; set it to false")
    if open_extra and not patterns and not all(_trivial(s) for s in props.values()):
        raise refuse(extra, path, "lets xgrammar write an extra key that spells a declared "
                     "name with \\u escapes (\"\\u0061\" for \"a\"), whose value then skips "
                     "that property's schema; set it to false")
    if "propertyNames" in node:
        _check_property_names(node, path, props, extra)
    low = node.get("minProperties")
    free_keys = bool(patterns) or "propertyNames" in node or open_extra
    if isinstance(low, int) and free_keys and low > len(required) + 1:
        raise refuse("minProperties", path, f"needs {low} keys, more than the required ones "
                     "plus one, and the others are free keys that xgrammar may repeat (a "
                     "repeated key counts once in the parsed object)")


def _trivial(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not set(schema) & ASSERTIONS)


def _check_pattern_properties(node: dict, path: str, props: dict) -> None:
    patterns = node["patternProperties"]
    if not isinstance(patterns, dict):
        raise refuse("patternProperties", path, "must be an object")
    if len({json.dumps(s, sort_keys=True) for s in patterns.values()}) > 1:
        raise refuse("patternProperties", path, "has patterns with different schemas, and "
                     "xgrammar checks a key against one pattern only; use one pattern")
    for pattern in patterns:
        try:
            clash = [name for name in props if _search(pattern, name)]
        except re.error as exc:
            raise refuse("patternProperties", path, f"pattern {pattern!r} is not a valid "
                         f"regex: {exc}") from None
        except TimeoutError:
            raise refuse("patternProperties", path, f"pattern {pattern!r} takes too long to "
                         "match against the declared property names (it backtracks); "
                         "simplify it") from None
        if clash:
            raise refuse("patternProperties", path, f"pattern {pattern!r} matches declared "
                         f"properties ({', '.join(clash)}), whose values xgrammar checks "
                         "against 'properties' only")


# Seconds one property name may take to match a pattern (a backtracking bomb such as
# (a+)+$ takes exponential time in Python's re; the `regex` module has a timeout).
_MATCH_TIMEOUT_S = 0.02


def _search(pattern: str, name: str) -> bool:
    try:
        import regex
    except ImportError:  # (transformers depends on it, so it is there)
        return re.search(pattern, name) is not None
    try:
        return regex.search(pattern, name, timeout=_MATCH_TIMEOUT_S) is not None
    except regex.error as exc:
        raise re.error(str(exc)) from None


def _check_property_names(node: dict, path: str, props: dict, extra: str | None) -> None:
    names = node["propertyNames"]
    if not isinstance(names, dict):
        raise refuse("propertyNames", path, "must be an object")
    if props or node.get("patternProperties"):
        raise refuse("propertyNames", path, "is beside properties or patternProperties, and "
                     "xgrammar then ignores it")
    if extra is not None and node[extra] is False:
        raise refuse("propertyNames", path, f"is beside {extra}: false, which admits only "
                     "{}, yet xgrammar writes keys")
    unknown = sorted(set(names) - PROPERTY_NAME_KEYWORDS)
    values = listed_values({k: v for k, v in names.items() if k in ("enum", "const")}) or []
    if (unknown or names.get("type", "string") != "string"
            or not all(isinstance(v, str) for v in values)):
        raise refuse("propertyNames", path, "may only hold string keywords (type string, "
                     "pattern, minLength, maxLength, format, string enum/const)")


def check_array(node: dict, path: str) -> None:
    if isinstance(node.get("items"), list):
        raise refuse("items", path, "is a list (draft-7 tuples); use prefixItems")


