"""Checks a JSON Schema before compilation: size and depth limits, and every keyword that
xgrammar's token masks do not enforce exactly (refused with a GrammarError naming the keyword
and its JSON path), so that every output the masks allow validates. What xgrammar 0.2.9 does
with each keyword was measured by walking its masks (tests/constrained/test_schema_honesty.py);
schema_rewrite first turns the cases that have an exact equivalent into it."""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ..errors import GrammarError
from .regex_check import RegexLimits, check_regex
from .schema_rewrite import (
    ANNOTATIONS,
    FORMAT_PATTERNS,
    json_key,
    listed_values,
    pointer_token,
    rewrite_schema,
)

# Keywords whose value is a map of name -> subschema.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# Keywords whose value is one subschema (or, for draft-7 `items`, a list of them).
_SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames",
                  "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Keywords xgrammar accepts but does not enforce; outputs could then fail validation.
_UNENFORCED = {
    "not": "negation",
    "if": "conditional subschemas (if/then/else)",
    "then": "conditional subschemas (if/then/else)",
    "else": "conditional subschemas (if/then/else)",
    "dependentRequired": "dependentRequired",
    "dependentSchemas": "dependentSchemas",
    "dependencies": "dependencies",
    "$dynamicRef": "$dynamicRef",
    "$recursiveRef": "$recursiveRef",
    "contains": "contains",  # dropped by xgrammar when items are also given
    "minContains": "contains",
    "maxContains": "contains",
    "additionalItems": "additionalItems (draft-7 tuples; use prefixItems and items)",
}
# Every keyword that constrains a value (the rest are annotations or unknown, which JSON
# Schema ignores).
_ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "prefixItems", "items", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "$ref", "$dynamicRef", "$recursiveRef", "additionalItems", "dependencies"})
# Formats xgrammar enforces as they are; FORMAT_PATTERNS lists those rewritten to a pattern.
_FORMATS = frozenset({"email", "uuid", "uri", "uri-reference", "uri-template", "duration"})
_FORMAT_GAPS = {
    "hostname": "xgrammar bounds neither a label (63) nor the name (253)",
    "idn-email": "xgrammar compiles it to an unchecked string",
    "idn-hostname": "xgrammar compiles it to an unchecked string",
    "iri": "xgrammar compiles it to an unchecked string",
    "iri-reference": "xgrammar compiles it to an unchecked string",
    "regex": "xgrammar compiles it to an unchecked string",
}
_PROPERTY_NAME_KEYWORDS = frozenset({"type", "pattern", "minLength", "maxLength", "format",
                                     "enum", "const"}) | ANNOTATIONS
_ALL_KINDS = frozenset({"null", "boolean", "number", "string", "array", "object"})


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 64 * 1024  # length of the schema document
    max_depth: int = 32  # nesting of JSON containers in the document
    max_subschemas: int = 2000
    max_branches: int = 2000  # subschemas of one anyOf / oneOf / allOf / prefixItems
    # Steps (values indexed, branch pairs compared) the oneOf overlap analysis may take over
    # the whole document; it is near-linear, so only contrived schemas reach this.
    max_overlap_steps: int = 200_000
    # Property names times patternProperties patterns to match (Python regexes, each under a
    # deadline, against backtracking bombs).
    max_pattern_matches: int = 20_000


def parse_json_schema(spec: str, limits: SchemaLimits, regex_limits: RegexLimits) -> Any:
    """Parse, rewrite (schema_rewrite) and check a schema document; return the rewritten
    schema, the one to compile. Raise GrammarError naming the problem."""
    if not isinstance(spec, str):
        raise GrammarError("json_schema must be a JSON string or object", param="json_schema")
    if len(spec) > limits.max_bytes:
        raise GrammarError(f"json_schema is {len(spec)} characters long; the limit is "
                           f"{limits.max_bytes}", param="json_schema")
    try:
        schema = json.loads(spec, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", param="json_schema") from None
    depth = _depth(schema, limits.max_depth)
    if depth > limits.max_depth:
        raise GrammarError(f"json_schema nests deeper than {limits.max_depth} levels",
                           param="json_schema")
    # NOTE: the cheap caps come first: everything after them may cost more than linear time.
    _count_subschemas(schema, limits)
    schema = rewrite_schema(schema)
    walker = _SchemaWalker(limits, regex_limits, schema)
    walker.visit(schema, "#")
    _RefGraph(schema, walker.paths).check()
    return schema


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_many_subschemas(limits: SchemaLimits) -> GrammarError:
    return GrammarError(f"json_schema has more than {limits.max_subschemas} subschemas "
                        "(limit max_subschemas)", param="json_schema")


def _count_subschemas(doc: Any, limits: SchemaLimits) -> None:
    """The subschema and branch caps, in one linear pass over the document (the walker's
    keywords), before any analysis that could cost more."""
    count, stack, widest = 0, [doc], None
    while stack:
        node = stack.pop()
        count += 1
        if count > limits.max_subschemas:
            raise _too_many_subschemas(limits)
        if not isinstance(node, dict):
            continue
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in _SCHEMA_VALUES:
            if key in node:
                value = node[key]
                stack.extend(value if isinstance(value, list) else [value])
        for key in _SCHEMA_LISTS:
            if isinstance(node.get(key), list):
                if len(node[key]) > limits.max_branches and widest is None:
                    widest = (key, len(node[key]))
                stack.extend(node[key])
    if widest is not None:
        raise GrammarError(f"json_schema: '{widest[0]}' has {widest[1]} subschemas; the limit "
                           f"is {limits.max_branches} (max_branches)", param="json_schema")


def _depth(doc: Any, limit: int) -> int:
    """Nesting depth of containers, stopping once past `limit`."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return deepest


def resolve_ref(root: Any, ref: str) -> Any:
    """The schema a local $ref ('#' or '#/json/pointer') names, or None."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _assertions(node: dict, *besides: str) -> list[str]:
    return sorted((set(node) & _ASSERTIONS) - set(besides))


def _unsupported(keyword: str, path: str, what: str) -> GrammarError:
    return GrammarError(f"json_schema uses {what} ('{keyword}' at {path}/{keyword}), which "
                        "constrained decoding cannot enforce", param="json_schema")


def _refuse(keyword: str, path: str, why: str) -> GrammarError:
    return GrammarError(f"json_schema: '{keyword}' at {path}/{keyword} {why}",
                        param="json_schema")


class _SchemaWalker:
    def __init__(self, limits: SchemaLimits, regex_limits: RegexLimits, root: Any):
        self.limits = limits
        self.regex_limits = regex_limits
        self.root = root
        self.num_subschemas = 0
        self.paths: dict[int, str] = {}  # id(subschema) -> its path
        self.overlap = _Overlap(root, limits.max_overlap_steps)
        self.pattern_matches = 0

    def visit(self, node: Any, path: str) -> None:
        self.num_subschemas += 1
        if self.num_subschemas > self.limits.max_subschemas:
            raise _too_many_subschemas(self.limits)
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise GrammarError(f"json_schema: the schema at {path} must be an object or a "
                               f"boolean, not {type(node).__name__}", param="json_schema")
        self.paths.setdefault(id(node), path)
        self._check_keywords(node, path)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for name, sub in node[key].items():
                    if key == "patternProperties":
                        check_regex(name, self.regex_limits, param="json_schema",
                                    what=f"property pattern at {path}/{key}")
                    self.visit(sub, f"{path}/{key}/{pointer_token(name)}")
        for key in _SCHEMA_VALUES:
            if key in node:
                value = node[key]
                subs = value if isinstance(value, list) else [value]
                for i, sub in enumerate(subs):
                    self.visit(sub, f"{path}/{key}" + (f"/{i}" if isinstance(value, list) else ""))
        for key in _SCHEMA_LISTS:
            if key in node:
                if not isinstance(node[key], list) or not node[key]:
                    raise GrammarError(f"json_schema: {key} at {path} must be a non-empty list",
                                       param="json_schema")
                for i, sub in enumerate(node[key]):
                    self.visit(sub, f"{path}/{key}/{i}")

    def _check_keywords(self, node: dict, path: str) -> None:
        for key, what in _UNENFORCED.items():
            if key in node:
                raise _unsupported(key, path, what)
        if node.get("uniqueItems") is True:
            raise _unsupported("uniqueItems", path, "uniqueItems")
        if "multipleOf" in node:
            _check_multiple_of(node, path)
        _check_type(node, path)
        _check_listed(node, path)
        _check_strings(node, path, self.regex_limits)
        self._check_ref(node, path)
        self._check_combinators(node, path)
        self._check_object(node, path)
        _check_array(node, path)

    def _check_object(self, node: dict, path: str) -> None:
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and isinstance(node.get("properties"), dict):
            self.pattern_matches += len(patterns) * len(node["properties"])
            if self.pattern_matches > self.limits.max_pattern_matches:
                raise _refuse("patternProperties", path, "and 'properties' make more than "
                              f"{self.limits.max_pattern_matches} (pattern, name) pairs to "
                              "check (limit max_pattern_matches); use fewer patterns")
        _check_object(node, path)

    def _check_ref(self, node: dict, path: str) -> None:
        if "$ref" not in node:
            return
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"json_schema: only local references ('#/...') are supported, "
                               f"got $ref {ref!r} at {path}", param="json_schema")
        if resolve_ref(self.root, ref) is None:
            raise _refuse("$ref", path, f"names {ref!r}, which is not in the document")
        siblings = _assertions(node, "$ref")
        if siblings:
            raise _refuse("$ref", path, f"has siblings ({', '.join(siblings)}) that xgrammar "
                          "ignores; move them into the referenced schema")

    def _check_combinators(self, node: dict, path: str) -> None:
        if isinstance(node.get("allOf"), list) and (
                len(node["allOf"]) > 1 or _assertions(node, "allOf")):
            raise _unsupported("allOf", path, "allOf with several subschemas or beside "
                               "other keywords; merge them into one schema")
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list) and _assertions(node, key):
                raise _refuse(key, path, f"has siblings ({', '.join(_assertions(node, key))}) "
                              "that xgrammar ignores; repeat them in every branch")
        if isinstance(node.get("oneOf"), list):
            overlap = self.overlap.find(node["oneOf"], path)
            if overlap is not None:
                i, j = overlap
                raise _refuse("oneOf", path, f"has branches {i} and {j} that a value may match "
                              "both of, and xgrammar reads oneOf as anyOf; make the branches "
                              "disjoint (other types, other const values of a required "
                              "property, ranges that do not meet) or use anyOf")


# xgrammar's limits for integer multipleOf (larger values are silently dropped).
_MAX_MULTIPLE_OF = 1024
_MAX_MULTIPLE_OF_RANGE = 10_000


def _check_multiple_of(node: dict, path: str) -> None:
    step = node["multipleOf"]
    if node.get("type") != "integer":
        raise _unsupported("multipleOf", path, "multipleOf without type integer")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= _MAX_MULTIPLE_OF:
        raise _unsupported("multipleOf", path,
                           f"multipleOf other than an integer in 1..{_MAX_MULTIPLE_OF}")
    low = _bound(node, "minimum", "exclusiveMinimum", +1)
    high = _bound(node, "maximum", "exclusiveMaximum", -1)
    if low is None and high is None:
        return
    if low is None or high is None or high - low + 1 > _MAX_MULTIPLE_OF_RANGE:
        raise _unsupported("multipleOf", path, f"multipleOf with a range that is one-sided or "
                           f"spans more than {_MAX_MULTIPLE_OF_RANGE} integers")


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


def _check_type(node: dict, path: str) -> None:
    if node.get("type") == []:
        raise _refuse("type", path, "is an empty list, which admits no value")


def _check_listed(node: dict, path: str) -> None:
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise _refuse("enum", path, "must be a non-empty list")
    siblings = _assertions(node, "enum", "const")
    for key in ("enum", "const"):
        if key in node and siblings:
            raise _refuse(key, path, f"has siblings ({', '.join(siblings)}) that xgrammar "
                          f"ignores (it emits every listed value); list only the values that "
                          f"satisfy them")


def _check_strings(node: dict, path: str, regex_limits: RegexLimits) -> None:
    fmt = node.get("format")
    if fmt is not None and not (isinstance(fmt, str) and (fmt in _FORMATS
                                                           or fmt in FORMAT_PATTERNS)):
        why = _FORMAT_GAPS.get(fmt, "is not a format that constrained decoding checks") if \
            isinstance(fmt, str) else "must be a string"
        raise _refuse("format", path, f"{fmt!r}: {why}; supported: "
                      f"{', '.join(sorted(_FORMATS | FORMAT_PATTERNS.keys()))}")
    if fmt is not None and "pattern" in node:
        raise _refuse("format", path, "is beside a pattern, and xgrammar drops the pattern; "
                      "put the format's shape into the pattern")
    if ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node):
        raise _unsupported("minLength" if "minLength" in node else "maxLength", path,
                           "minLength/maxLength together with pattern or format; put the "
                           "length bound into the pattern")
    pattern = node.get("pattern")
    if pattern is not None:
        check_regex(pattern, regex_limits, param="json_schema", what=f"pattern at {path}")


def _check_object(node: dict, path: str) -> None:
    props = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required = node.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _refuse("required", path, "must be a list of property names")
    missing = [r for r in required if r not in props]
    if missing:
        raise _refuse("required", path, f"names {', '.join(map(repr, missing))}, which "
                      "'properties' does not declare, and xgrammar then never writes it; "
                      "declare it")
    extra = next((k for k in ("additionalProperties", "unevaluatedProperties") if k in node),
                 None)
    open_extra = extra is not None and node[extra] is not False
    patterns = node.get("patternProperties")
    if patterns:
        _check_pattern_properties(node, path, props)
    if patterns and props and open_extra:
        raise _refuse(extra, path, "is beside properties and patternProperties, where "
                      "xgrammar writes extra keys that may be a declared name or match a "
                      "pattern, unchecked by their schemas; set it to false")
    if open_extra and not patterns and not all(_trivial(s) for s in props.values()):
        raise _refuse(extra, path, "lets xgrammar write an extra key that spells a declared "
                      "name with \\u escapes (\"\\u0061\" for \"a\"), whose value then skips "
                      "that property's schema; set it to false")
    if "propertyNames" in node:
        _check_property_names(node, path, props, extra)
    low = node.get("minProperties")
    free_keys = bool(patterns) or "propertyNames" in node or open_extra
    if isinstance(low, int) and free_keys and low > len(required) + 1:
        raise _refuse("minProperties", path, f"needs {low} keys, more than the required ones "
                      "plus one, and the others are free keys that xgrammar may repeat (a "
                      "repeated key counts once in the parsed object)")


def _trivial(schema: Any) -> bool:
    return schema is True or (isinstance(schema, dict) and not set(schema) & _ASSERTIONS)


def _check_pattern_properties(node: dict, path: str, props: dict) -> None:
    patterns = node["patternProperties"]
    if not isinstance(patterns, dict):
        raise _refuse("patternProperties", path, "must be an object")
    if len({json.dumps(s, sort_keys=True) for s in patterns.values()}) > 1:
        raise _refuse("patternProperties", path, "has patterns with different schemas, and "
                      "xgrammar checks a key against one pattern only; use one pattern")
    for pattern in patterns:
        try:
            clash = [name for name in props if _search(pattern, name)]
        except re.error as exc:
            raise _refuse("patternProperties", path, f"pattern {pattern!r} is not a valid "
                          f"regex: {exc}") from None
        except TimeoutError:
            raise _refuse("patternProperties", path, f"pattern {pattern!r} takes too long to "
                          "match against the declared property names (it backtracks); "
                          "simplify it") from None
        if clash:
            raise _refuse("patternProperties", path, f"pattern {pattern!r} matches declared "
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
        raise _refuse("propertyNames", path, "must be an object")
    if props or node.get("patternProperties"):
        raise _refuse("propertyNames", path, "is beside properties or patternProperties, and "
                      "xgrammar then ignores it")
    if extra is not None and node[extra] is False:
        raise _refuse("propertyNames", path, f"is beside {extra}: false, which admits only "
                      "{}, yet xgrammar writes keys")
    unknown = sorted(set(names) - _PROPERTY_NAME_KEYWORDS)
    values = listed_values({k: v for k, v in names.items() if k in ("enum", "const")}) or []
    if (unknown or names.get("type", "string") != "string"
            or not all(isinstance(v, str) for v in values)):
        raise _refuse("propertyNames", path, "may only hold string keywords (type string, "
                      "pattern, minLength, maxLength, format, string enum/const)")


def _check_array(node: dict, path: str) -> None:
    if isinstance(node.get("items"), list):
        raise _refuse("items", path, "is a list (draft-7 tuples); use prefixItems")


# ---- oneOf: exact only when no value can match two branches ----

@dataclass
class _Shape:
    kinds: frozenset  # JSON types a value may have ("number" covers "integer")
    values: set | None = None  # json_key of every admitted value, when listed
    low: tuple | None = None  # (bound, exclusive) for numbers
    high: tuple | None = None
    integer: bool = False
    tags: dict | None = None  # required property -> json_keys of its listed values


_SHAPE_DEPTH = 8


class _Overlap:
    """Finds two branches of a oneOf that one value may match (xgrammar reads oneOf as
    anyOf). Near-linear: listed values are indexed (a hash for values, sorted lists for
    numbers), number ranges swept in order, tagged objects grouped by tag value; only the
    pairs these cannot tell apart are compared, each counting against `max_steps`, which
    bounds the whole document's analysis. Shapes are memoized, so shared $refs cost once."""

    def __init__(self, root: Any, max_steps: int):
        self.root = root
        self.max_steps = max_steps
        self.steps = 0
        self.path = "#"
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._keys: dict[int, frozenset] = {}
        self._keep: list = []  # the nodes memoized by id stay alive

    def find(self, branches: list, path: str) -> tuple[int, int] | None:
        self.path = path
        shapes = [self.shape(b) for b in branches]
        listed = [i for i, s in enumerate(shapes) if s.values is not None]
        others = [i for i, s in enumerate(shapes) if s.values is None]
        found = [p for p in (self._listed_pair(shapes, listed),
                             self._listed_other_pair(shapes, listed, others),
                             self._other_pair(shapes, others)) if p is not None]
        return min((min(p), max(p)) for p in found) if found else None

    def charge(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.max_steps:
            raise GrammarError(
                f"json_schema: 'oneOf' at {self.path}/oneOf makes checking that its branches "
                f"are disjoint take more than {self.max_steps} steps (limit max_overlap_steps); "
                "use fewer or simpler branches, or anyOf", param="json_schema")

    # ---- shapes ----

    def shape(self, node: Any, depth: int = 0) -> _Shape:
        node = _deref(node, self.root)
        memo = (id(node), depth)
        shape = self._shapes.get(memo)
        if shape is None:
            self.charge(1)
            shape = self._shapes[memo] = self._shape(node, depth)
            self._keep.append(node)
        return shape

    def _shape(self, node: Any, depth: int) -> _Shape:
        if not isinstance(node, dict) or depth > _SHAPE_DEPTH:
            return _Shape(frozenset() if node is False else _ALL_KINDS)
        values = self.keys(node)
        if values is not None:
            return _Shape(frozenset(_key_kind(k) for k in values), values)
        types = node.get("type")
        types = [types] if isinstance(types, str) else types
        if isinstance(types, list):
            kinds = frozenset("number" if t == "integer" else t for t in types)
        elif isinstance(node.get("anyOf") or node.get("oneOf"), list):
            subs = [self.shape(b, depth + 1) for b in node.get("anyOf") or node["oneOf"]]
            return _Shape(frozenset().union(*(s.kinds for s in subs)))
        else:
            kinds = _ALL_KINDS
        return _Shape(kinds, low=_numeric_bound(node, "minimum", "exclusiveMinimum", max),
                      high=_numeric_bound(node, "maximum", "exclusiveMaximum", min),
                      integer=isinstance(types, list) and "number" not in types,
                      tags=self._tags(node))

    def keys(self, node: Any) -> frozenset | None:
        """json_key of each value an enum/const-only schema lists (None for other schemas)."""
        if id(node) in self._keys:
            return self._keys[id(node)]
        values = listed_values(node)
        if values is None:
            return None
        self.charge(len(values))
        keys = self._keys[id(node)] = frozenset(json_key(v) for v in values)
        self._keep.append(node)
        return keys

    def _tags(self, node: dict) -> dict:
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        tags = {}
        for name in required:
            keys = self.keys(_deref(props.get(name), self.root)) if isinstance(name, str) \
                else None
            if keys is not None:
                tags[name] = keys
        return tags

    # ---- pairs ----

    def _listed_pair(self, shapes: list[_Shape], listed: list[int]) -> tuple | None:
        """Two enum/const branches listing one value."""
        owner: dict = {}
        for i in listed:
            self.charge(len(shapes[i].values))
            for key in shapes[i].values:
                j = owner.setdefault(key, i)
                if j != i:
                    return j, i
        return None

    def _listed_other_pair(self, shapes: list[_Shape], listed: list[int],
                           others: list[int]) -> tuple | None:
        """An enum/const branch listing a value that another branch admits."""
        if not listed or not others:
            return None
        kind_owner: dict[str, int] = {}  # kind other than number -> first branch listing one
        numbers: list[tuple] = []  # (value, branch)
        integers: list[tuple] = []
        for i in listed:
            self.charge(len(shapes[i].values))
            for key in shapes[i].values:
                kind = _key_kind(key)
                if kind != "number":
                    kind_owner.setdefault(kind, i)
                else:
                    numbers.append((key[1], i))
                    if isinstance(key[1], int) or key[1].is_integer():
                        integers.append((key[1], i))
        numbers.sort(key=lambda item: item[0])
        integers.sort(key=lambda item: item[0])
        num_values = [v for v, _ in numbers]
        int_values = [v for v, _ in integers]
        best = None
        for y in others:
            self.charge(1)
            shape = shapes[y]
            for kind in shape.kinds:
                if kind != "number" and kind in kind_owner:
                    best = _least(best, (kind_owner[kind], y))
            if "number" in shape.kinds:
                values, items = (int_values, integers) if shape.integer else (num_values,
                                                                              numbers)
                start = 0 if shape.low is None else (
                    bisect_right if shape.low[1] else bisect_left)(values, shape.low[0])
                end = len(values) if shape.high is None else (
                    bisect_left if shape.high[1] else bisect_right)(values, shape.high[0])
                if start < end:
                    best = _least(best, (min(i for _, i in items[start:end]), y))
                    self.charge(end - start)
        return best

    def _other_pair(self, shapes: list[_Shape], others: list[int]) -> tuple | None:
        """Two branches, neither a list of values, that one value may match."""
        groups: dict[frozenset, list[int]] = {}
        for i in others:
            groups.setdefault(shapes[i].kinds, []).append(i)
        kinds = list(groups)
        best = None
        for a, ka in enumerate(kinds):
            for kb in kinds[a:]:
                common = ka & kb
                same = ka == kb
                if not common or (same and len(groups[ka]) < 2):
                    continue
                self.charge(1)
                if common == {"number"}:
                    pair = self._ranges_pair(shapes, groups[ka], None if same else groups[kb])
                elif common == {"object"}:
                    pair = self._objects_pair(shapes, groups[ka], None if same else groups[kb])
                else:  # a value of a common kind that neither ranges nor tags tell apart
                    pair = tuple(groups[ka][:2]) if same else (groups[ka][0], groups[kb][0])
                best = _least(best, pair)
        return best

    def _ranges_pair(self, shapes: list[_Shape], first: list[int],
                     second: list[int] | None) -> tuple | None:
        """Number branches whose ranges meet: a sweep in order of lower bounds, comparing
        each range with the ones that start before it ends."""
        side = {i: 0 for i in first} | {i: 1 for i in second or ()}
        order = sorted(side, key=lambda i: _low_key(shapes[i].low))
        best = None
        for n, a in enumerate(order):
            for b in order[n + 1:]:
                self.charge(1)
                if _below(shapes[a].high, shapes[b].low):
                    break  # b and every later range start after a ends
                if (second is None or side[a] != side[b]) and not _disjoint(shapes[a],
                                                                            shapes[b]):
                    best = _least(best, (a, b))
                    break
        return best

    def _objects_pair(self, shapes: list[_Shape], first: list[int],
                      second: list[int] | None) -> tuple | None:
        """Object branches that no required property's listed values tell apart. Branches
        are grouped by the values of the most common tag: two with no value in common differ
        there; the rest are compared."""
        side = {i: 0 for i in first} | {i: 1 for i in second or ()}
        members = sorted(side)
        counts: dict[str, int] = {}
        for i in members:
            for name in shapes[i].tags or ():
                counts[name] = counts.get(name, 0) + 1
        self.charge(len(members) + len(counts))
        tag = max(counts, key=lambda name: (counts[name], name)) if counts else None
        by_value: dict = {}
        untagged = []
        for i in members:
            tags = shapes[i].tags or {}
            if tag in tags:
                self.charge(len(tags[tag]))
                for key in tags[tag]:
                    by_value.setdefault(key, []).append(i)
            else:
                untagged.append(i)
        seen: set = set()

        def overlap(a: int, b: int) -> bool:
            a, b = min(a, b), max(a, b)
            if a == b or (a, b) in seen or (second is not None and side[a] == side[b]):
                return False
            seen.add((a, b))
            self.charge(1)
            return not self._tags_disjoint(shapes[a], shapes[b])

        for a in untagged:
            for b in members:
                if overlap(a, b):
                    return a, b
        for group in by_value.values():
            for n, a in enumerate(group):
                for b in group[n + 1:]:
                    if overlap(a, b):
                        return a, b
        return None

    def _tags_disjoint(self, a: _Shape, b: _Shape) -> bool:
        if not (a.tags and b.tags):
            return False
        for name, keys in a.tags.items():
            if name in b.tags:
                self.charge(min(len(keys), len(b.tags[name])))
                if not keys & b.tags[name]:
                    return True
        return False


def _least(best: tuple | None, pair: tuple | None) -> tuple | None:
    if pair is None:
        return best
    pair = (min(pair), max(pair))
    return pair if best is None or pair < best else best


def _low_key(low: tuple | None) -> tuple:
    """Lower bounds in increasing order: none first, and an inclusive bound before an
    exclusive one at the same number (as _below compares them)."""
    return (0,) if low is None else (1, low[0], low[1])


def _key_kind(key: tuple) -> str:
    if key[0] == "literal":
        return "null" if key[1] is None else "boolean"
    return key[0]


def _deref(node: Any, root: Any) -> Any:
    for _ in range(64):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            node = resolve_ref(root, node["$ref"])
        elif isinstance(node, dict) and isinstance(node.get("allOf"), list) and len(
                node["allOf"]) == 1:
            node = node["allOf"][0]
        else:
            return node
    return node


def _numeric_bound(node: dict, inclusive: str, exclusive: str, tighter) -> tuple | None:
    bounds = [(node[k], k == exclusive) for k in (inclusive, exclusive)
              if isinstance(node.get(k), (int, float)) and not isinstance(node[k], bool)]
    if not bounds:
        return None
    best = tighter(b[0] for b in bounds)
    return best, any(b == (best, True) for b in bounds)


def _disjoint(a: _Shape, b: _Shape) -> bool:
    """Whether no value matches both of two shapes that list no values."""
    common = a.kinds & b.kinds
    if not common:
        return True
    return common == {"number"} and (_below(a.high, b.low) or _below(b.high, a.low))


def _below(high: tuple | None, low: tuple | None) -> bool:
    """Whether every number under `high` is under `low` too: the ranges do not meet."""
    if high is None or low is None:
        return False
    return high[0] < low[0] or (high[0] == low[0] and (high[1] or low[1]))


# ---- $ref cycles ----

class _RefGraph:
    """Refuses $ref cycles that never enter an object or array (validating them never ends;
    xgrammar loops or errs) and subschemas that admit no finite value (a required property
    that refers back to its own schema), where the masks would never let the output end."""

    def __init__(self, root: Any, paths: dict[int, str]):
        self.root = root
        self.paths = paths

    def check(self) -> None:
        reachable = self._reachable()
        self._check_cycles(reachable)
        finite = self._finite(reachable)
        stuck = [self.paths.get(id(node), "#") for node in reachable
                 if "$ref" in node and not self._ok(node, finite)]
        if stuck:  # name the deepest: the $ref that closes the cycle
            raise _refuse("$ref", max(stuck, key=lambda p: (p.count("/"), p)), "leads to a "
                          "schema that admits no finite value: each level requires another")
        if isinstance(self.root, dict) and not self._ok(self.root, finite):
            raise GrammarError("json_schema admits no finite value", param="json_schema")

    def _children(self, node: dict, same_value: bool) -> list:
        subs = []
        if isinstance(node.get("$ref"), str):
            subs.append(resolve_ref(self.root, node["$ref"]))
        for key in ("anyOf", "oneOf", "allOf"):
            subs.extend(node.get(key) or [])
        if not same_value:
            for key in ("properties", "patternProperties"):
                subs.extend((node.get(key) or {}).values())
            for key in _SCHEMA_VALUES:
                subs.append(node.get(key))
            subs.extend(node.get("prefixItems") or [])
        return [s for s in subs if isinstance(s, dict)]

    def _reachable(self) -> list[dict]:
        if not isinstance(self.root, dict):
            return []
        seen, order, stack = {id(self.root)}, [], [self.root]
        while stack:
            node = stack.pop()
            order.append(node)
            for child in self._children(node, same_value=False):
                if id(child) not in seen:
                    seen.add(id(child))
                    stack.append(child)
        return order

    def _check_cycles(self, nodes: list[dict]) -> None:
        state: dict[int, int] = {}  # 1: on the current path, 2: done
        for start in nodes:
            if state.get(id(start)):
                continue
            stack = [(start, iter(self._children(start, same_value=True)))]
            state[id(start)] = 1
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    state[id(node)] = 2
                    stack.pop()
                elif state.get(id(child)) == 1:
                    raise _refuse("$ref", self._ref_on(stack), "closes a cycle that never "
                                  "enters an object or array, so validating never ends")
                elif not state.get(id(child)):
                    state[id(child)] = 1
                    stack.append((child, iter(self._children(child, same_value=True))))

    def _ref_on(self, stack: list) -> str:
        for node, _ in reversed(stack):
            if "$ref" in node:
                return self.paths.get(id(node), "#")
        return "#"

    def _finite(self, nodes: list[dict]) -> set[int]:
        """ids of the subschemas that admit some finite value (a least fixpoint), in time
        linear in the document: each subschema is an OR of ANDs of others (_clauses); a
        clause counts its members not yet finite, and a subschema turns finite when one of
        its clauses reaches zero."""
        finite: set[int] = set()
        remaining: list[int] = []  # per clause: members not yet known finite
        owner: list[int] = []  # per clause: the id of its subschema
        uses: dict[int, list[int]] = {}  # id(member) -> the clauses it is in
        ready = []
        for node in nodes:
            for clause in self._clauses(node):
                members = {id(m) for m in clause}
                if not members:
                    ready.append(id(node))
                    continue
                index = len(remaining)
                remaining.append(len(members))
                owner.append(id(node))
                for member in members:
                    uses.setdefault(member, []).append(index)
        while ready:
            node_id = ready.pop()
            if node_id in finite:
                continue
            finite.add(node_id)
            for index in uses.get(node_id, ()):
                remaining[index] -= 1
                if remaining[index] == 0 and owner[index] not in finite:
                    ready.append(owner[index])
        return finite

    def _clauses(self, node: dict) -> list[list[dict]]:
        """When `node` admits a finite value: when all the subschemas of one of these lists
        do (a False among them rules its list out; True and non-schemas need nothing)."""
        if isinstance(node.get("$ref"), str):
            return _clause([resolve_ref(self.root, node["$ref"])])
        if "enum" in node or "const" in node:
            return [[]]
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                return [c for s in node[key] for c in _clause([s])]
        if isinstance(node.get("allOf"), list):
            return _clause(node["allOf"])
        types = node.get("type")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list):
            types = ["object"] if "properties" in node else ["array"] if (
                "items" in node or "prefixItems" in node) else ["null"]
        clauses = []
        for type_name in types:
            if type_name == "object":
                props = node.get("properties") if isinstance(node.get("properties"),
                                                             dict) else {}
                required = node.get("required", [])
                required = required if isinstance(required, list) else []
                clauses += _clause([props.get(r, True) if isinstance(r, str) else True
                                    for r in required])
            elif type_name == "array":
                least = node.get("minItems", 0) if isinstance(node.get("minItems"),
                                                              int) else 0
                prefix = node.get("prefixItems") or []
                prefix = prefix if isinstance(prefix, list) else []
                clauses += _clause(prefix[:least] + (
                    [] if least <= len(prefix) else [node.get("items", True)]))
            else:
                clauses.append([])
        return clauses

    def _ok(self, schema: Any, finite: set[int]) -> bool:
        return schema is not False and (not isinstance(schema, dict) or id(schema) in finite)


def _clause(schemas: list) -> list[list[dict]]:
    """[the subschemas among `schemas`], or [] (no way) if one of them is False."""
    if any(s is False for s in schemas):
        return []
    return [[s for s in schemas if isinstance(s, dict)]]
