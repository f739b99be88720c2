"""Rewrites a JSON Schema, before it is checked and compiled, into one whose every output
xgrammar allows validates against the original. Each rewrite was measured against xgrammar
0.2.9 by walking its token masks (tests/constrained/test_schema_honesty.py):

- `enum`/`const` beside `type`: xgrammar emits every listed value and ignores `type`; the
  values are filtered by the type instead (and `const` beside `enum` intersected with it).
- `oneOf` whose branches are all `enum`/`const`: xgrammar reads `oneOf` as `anyOf`, so a value
  listed in two branches would fail validation; it becomes an `enum` of the values listed in
  exactly one branch.
- `format` values whose xgrammar grammar admits strings that are not valid (days past the end
  of a month, second 60, year 0000, IPv4 octets with leading zeros, surrogate code points in
  JSON pointers) become an exact `pattern`.
- A schema without `type` whose only type-specific keywords are string or number ones
  (`pattern`, `minimum`, ...): xgrammar emits any JSON value unconstrained; it gets the type
  those keywords are about, as xgrammar itself narrows an untyped schema with `properties`
  to objects.

Anything else is left as it is for schema_check to enforce or refuse.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import GrammarError

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$schema", "$id", "discriminator",
                         "contentEncoding", "contentMediaType", "contentSchema"})

# ---- exact patterns for the formats xgrammar gets wrong ----

_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001-9999
_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
# No second 60: RFC 3339 allows a leap second, jsonschema's checker (rfc3339-validator) not.
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
         r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_JSON_POINTER = r"(?:/(?:[^/~]|~[01])*)*"


def _ipv6() -> str:
    """RFC 4291 text forms: eight groups, or `a` groups, '::', then at most 7 - a groups (an
    IPv4 tail counting as two)."""
    h16 = "[0-9A-Fa-f]{1,4}"
    forms = [f"(?:{h16}:){{7}}{h16}", f"(?:{h16}:){{6}}{_IPV4}"]
    for left in range(8):
        head = "" if left == 0 else f"(?:{h16}:){{{left - 1}}}{h16}"
        tails = []
        if left < 7:
            tails.append(f"{h16}(?::{h16}){{0,{6 - left}}}")
        if left <= 5:
            tails.append(f"(?:{h16}:){{0,{5 - left}}}{_IPV4}")
        forms.append(f"{head}::" + (f"(?:{'|'.join(tails)})?" if tails else ""))
    return "(?:" + "|".join(forms) + ")"


FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "json-pointer": _JSON_POINTER,
    # jsonschema's checker refuses a digit after a 0 ("100"), so the integer is [1-9]+0? or 0
    "relative-json-pointer": rf"(?:0|[1-9]+0?)(?:#|{_JSON_POINTER})",
}
FORMAT_PATTERNS = {name: f"^{body}$" for name, body in FORMAT_PATTERNS.items()}

_STRING_KEYWORDS = ("pattern", "format", "minLength", "maxLength")
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_OTHER_TYPED_KEYWORDS = ("properties", "patternProperties", "additionalProperties",
                         "propertyNames", "required", "minProperties", "maxProperties",
                         "unevaluatedProperties", "items", "prefixItems", "minItems", "maxItems",
                         "unevaluatedItems", "uniqueItems", "contains", "additionalItems")
_NOT_NARROWED = ("type", "$ref", "enum", "const", "anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames", "unevaluatedItems",
                  "unevaluatedProperties", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


# ---- JSON values as JSON Schema compares them ----

def json_key(value: Any) -> Any:
    """A hashable key equal for values JSON Schema calls equal: 1 == 1.0, true != 1."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, list):
        return ("array", tuple(json_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, json_key(v)) for k, v in value.items()))
    return ("string", value)


def json_type_matches(value: Any, type_name: str) -> bool:
    """Whether `value` is of JSON Schema type `type_name` (an integral float is an integer)."""
    if type_name == "null":
        return value is None
    if type_name == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if type_name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if type_name == "number":
        return isinstance(value, (int, float))
    kinds = {"string": str, "array": list, "object": dict}
    return type_name in kinds and isinstance(value, kinds[type_name])


def listed_values(node: Any) -> list | None:
    """The values an enum/const-only schema admits, or None for any other schema."""
    if not isinstance(node, dict) or not ({"enum", "const"} & node.keys()):
        return None
    if set(node) - ANNOTATIONS - {"enum", "const"}:
        return None
    values = node["enum"] if "enum" in node else [node["const"]]
    if not isinstance(values, list):
        return None
    if "const" in node and "enum" in node:
        values = [v for v in values if json_key(v) == json_key(node["const"])]
    return values


def pointer_token(name: str) -> str:
    """A property name as a JSON pointer token (for the paths in messages)."""
    return name.replace("~", "~0").replace("/", "~1")


# ---- the rewrite ----

def rewrite_schema(schema: Any) -> Any:
    """The schema with the rewrites above applied everywhere (a new document; the argument is
    not modified). Raises GrammarError when a rewrite shows that a schema admits no value."""
    return _rewrite(schema, "#")


def rewrite_spec(kind: str, spec: str) -> str:
    """A constraint's spec with its JSON Schemas rewritten (json_schema, structural_tag)."""
    if kind not in ("json_schema", "structural_tag") or not isinstance(spec, str):
        return spec
    try:
        doc = json.loads(spec)
    except (ValueError, RecursionError):
        return spec  # compiling reports it
    if kind == "json_schema":
        return json.dumps(rewrite_schema(doc))
    return json.dumps(_rewrite_tag(doc))


def _rewrite_tag(node: Any) -> Any:
    """Rewrite the schemas inside a structural tag (xgrammar's format or SGLang's legacy one)."""
    if isinstance(node, list):
        return [_rewrite_tag(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        is_schema = (key == "json_schema" and node.get("type") == "json_schema") or (
            key == "schema" and {"begin", "end"} <= node.keys())  # legacy structures
        out[key] = rewrite_schema(value) if is_schema else _rewrite_tag(value)
    return out


def _rewrite(node: Any, path: str) -> Any:
    if not isinstance(node, dict):
        return node
    node = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            node[key] = {name: _rewrite(sub, f"{path}/{key}/{pointer_token(name)}")
                         for name, sub in node[key].items()}
    for key in _SCHEMA_VALUES:
        if isinstance(node.get(key), dict):
            node[key] = _rewrite(node[key], f"{path}/{key}")
    for key in _SCHEMA_LISTS:
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
    """`(...)?` written as `(...){0,1}`: in a JSON string xgrammar 0.2.9 compiles an optional
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
