"""Rewrites a JSON Schema, before it is checked and compiled, into one whose every output
xgrammar allows validates against the original. Each rewrite was measured by walking
xgrammar's token masks (tests/runtime/constrained/test_schema_honesty.py):

- `enum`/`const` beside `type`: xgrammar emits every listed value and ignores `type`; the
  values are filtered by the type instead (and `const` beside `enum` intersected with it).
- `oneOf` whose branches are all `enum`/`const`: xgrammar reads `oneOf` as `anyOf`, so a value
  listed in two branches would fail validation; it becomes an `enum` of the values listed in
  exactly one branch.
- `format` values whose xgrammar grammar admits strings that are not valid become an exact
  `pattern` (format_patterns.py).
- `(...)?` in a pattern becomes `(...){0,1}` (fix_pattern).
- A schema without `type` whose only type-specific keywords are string or number ones
  (`pattern`, `minimum`, ...): xgrammar emits any JSON value unconstrained; it gets the type
  those keywords are about, as xgrammar itself narrows an untyped schema with `properties`
  to objects.

Anything else is left as it is for the checks to enforce or refuse.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import GrammarError
from ..schema_terms import (
    ANNOTATIONS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    SCHEMA_VALUES,
    json_key,
    json_type_matches,
    listed_values,
    pointer_token,
)
from .format_patterns import FORMAT_PATTERNS

_STRING_KEYWORDS = ("pattern", "format", "minLength", "maxLength")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_OTHER_TYPED_KEYWORDS = ("properties", "patternProperties", "additionalProperties",
                         "propertyNames", "required", "minProperties", "maxProperties",
                         "unevaluatedProperties", "items", "prefixItems", "minItems", "maxItems",
                         "unevaluatedItems", "uniqueItems", "contains", "additionalItems")
_NOT_NARROWED = ("type", "$ref", "enum", "const", "anyOf", "oneOf", "allOf")


def rewrite_schema(schema: Any) -> Any:
    """The schema with the rewrites above applied everywhere (a new document; the argument is
    not modified). Raises GrammarError when a rewrite shows that a schema admits no value."""
    return _rewrite(schema, "#")


def _rewrite(node: Any, path: str) -> Any:
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for key in SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {name: _rewrite(sub, f"{path}/{key}/{pointer_token(name)}")
                         for name, sub in node[key].items()}
    for key in SCHEMA_VALUES:
        if isinstance(node.get(key), dict):
            node[key] = _rewrite(node[key], f"{path}/{key}")
    for key in SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [_rewrite(sub, f"{path}/{key}/{i}") for i, sub in enumerate(node[key])]
    node = _filter_listed_values(node, path)
    node = _one_of_values(node, path)
    node = _fix_patterns(_format_to_pattern(node))
    return _narrow_untyped(node)


def _filter_listed_values(node: dict, path: str) -> dict:
    """{"type": T, "enum": [...]} -> {"enum": [the values of type T]}; const likewise."""
    if not ({"enum", "const"} & node.keys()) or set(node) - ANNOTATIONS - {"enum", "const",
                                                                             "type"}:
        return node
    if "enum" in node and not isinstance(node["enum"], list):
        return node
    types = node.get("type", [])
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        return node
    if "type" not in node and not ("enum" in node and "const" in node):
        return node
    values = listed_values({k: v for k, v in node.items() if k != "type"})
    if types:
        values = [v for v in values if any(json_type_matches(v, t) for t in types)]
    if not values:
        keyword = "enum" if "enum" in node else "const"
        raise GrammarError(f"json_schema: '{keyword}' at {path}/{keyword} lists no value that "
                           f"its siblings ({', '.join(sorted(set(node) - ANNOTATIONS))}) "
                           "allow, so the schema admits no value", param="json_schema")
    out = {k: v for k, v in node.items() if k not in ("type", "enum", "const")}
    if len(values) == 1:
        out["const"] = values[0]
    else:
        out["enum"] = values
    return out


def _one_of_values(node: dict, path: str) -> dict:
    """oneOf of enum/const branches -> the enum of values listed in exactly one branch."""
    branches = node.get("oneOf")
    if not isinstance(branches, list) or not branches or set(node) - ANNOTATIONS - {"oneOf"}:
        return node
    per_branch = [listed_values(b) for b in branches]
    if any(values is None for values in per_branch):
        return node
    count: dict[Any, int] = {}
    first: dict[Any, Any] = {}
    for values in per_branch:
        for key in {json_key(v) for v in values}:
            count[key] = count.get(key, 0) + 1
        for v in values:
            first.setdefault(json_key(v), v)
    kept = [value for key, value in first.items() if count[key] == 1]
    if not kept:
        raise GrammarError(f"json_schema: 'oneOf' at {path}/oneOf lists every value in "
                           "several branches, so the schema admits no value",
                           param="json_schema")
    out = {k: v for k, v in node.items() if k != "oneOf"}
    out["enum"] = kept
    return out


def fix_pattern(pattern: str) -> str:
    """`(...)?` written as `(...){0,1}`: in a JSON string xgrammar compiles an optional
    group that ends in a repeat wrongly (`^a(bc+)?$` admits "ac")."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]" or (out and out[-1] in ("[", "[^"))
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif c == "?" and out and out[-1] == ")":
            c = "{0,1}"
        out.append(c)
        i += 1
    return "".join(out)


def _fix_patterns(node: dict) -> dict:
    out = dict(node)
    if isinstance(node.get("pattern"), str):
        out["pattern"] = fix_pattern(node["pattern"])
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        fixed = {fix_pattern(k): v for k, v in patterns.items()}
        if len(fixed) == len(patterns) or len({json.dumps(v, sort_keys=True)
                                               for v in patterns.values()}) == 1:
            out["patternProperties"] = fixed  # (two spellings of one pattern merge if alike)
    return out


def _format_to_pattern(node: dict) -> dict:
    name = node.get("format")
    if not isinstance(name, str) or name not in FORMAT_PATTERNS or "pattern" in node:
        return node
    out = {k: v for k, v in node.items() if k != "format"}
    out["pattern"] = FORMAT_PATTERNS[name]
    return out


def _narrow_untyped(node: dict) -> dict:
    if any(k in node for k in _NOT_NARROWED + _OTHER_TYPED_KEYWORDS):
        return node
    types = ([] if not any(k in node for k in _STRING_KEYWORDS) else ["string"]) + (
        [] if not any(k in node for k in _NUMBER_KEYWORDS) else
        ["integer" if "multipleOf" in node else "number"])
    if not types:
        return node
    return {**node, "type": types[0] if len(types) == 1 else types}
