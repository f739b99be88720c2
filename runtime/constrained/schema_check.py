"""Checks a JSON Schema before compilation: size and depth limits, and keywords that token
masks cannot enforce (rejected, so that every output that passes the grammar validates)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import GrammarError
from .regex_check import RegexLimits, check_regex

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
}
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated",
                          "readOnly", "writeOnly", "$schema", "$id"})


@dataclass(frozen=True)
class SchemaLimits:
    max_bytes: int = 64 * 1024  # length of the schema document
    max_depth: int = 32  # nesting of JSON containers in the document
    max_subschemas: int = 2000


def parse_json_schema(spec: str, limits: SchemaLimits, regex_limits: RegexLimits) -> Any:
    """Parse and check a schema document; return it. Raise GrammarError naming the problem."""
    if not isinstance(spec, str):
        raise GrammarError("json_schema must be a JSON string or object", param="json_schema")
    if len(spec) > limits.max_bytes:
        raise GrammarError(f"json_schema is {len(spec)} characters long; the limit is "
                           f"{limits.max_bytes}", param="json_schema")
    try:
        schema = json.loads(spec)
    except (ValueError, RecursionError) as exc:
        raise GrammarError(f"json_schema is not valid JSON: {exc}", param="json_schema") from None
    depth = _depth(schema, limits.max_depth)
    if depth > limits.max_depth:
        raise GrammarError(f"json_schema nests deeper than {limits.max_depth} levels",
                           param="json_schema")
    _SchemaWalker(limits, regex_limits).visit(schema, "#")
    return schema


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


class _SchemaWalker:
    def __init__(self, limits: SchemaLimits, regex_limits: RegexLimits):
        self.limits = limits
        self.regex_limits = regex_limits
        self.num_subschemas = 0

    def visit(self, node: Any, path: str) -> None:
        self.num_subschemas += 1
        if self.num_subschemas > self.limits.max_subschemas:
            raise GrammarError(f"json_schema has more than {self.limits.max_subschemas} "
                               "subschemas", param="json_schema")
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise GrammarError(f"json_schema: the schema at {path} must be an object or a "
                               f"boolean, not {type(node).__name__}", param="json_schema")
        self._check_keywords(node, path)
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for name, sub in node[key].items():
                    if key == "patternProperties":
                        check_regex(name, self.regex_limits, param="json_schema",
                                    what=f"property pattern at {path}/{key}")
                    self.visit(sub, f"{path}/{key}/{name}")
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
                raise _unsupported(f"{what} ('{key}' at {path})")
        if node.get("uniqueItems") is True:
            raise _unsupported(f"uniqueItems ('uniqueItems' at {path})")
        if "multipleOf" in node:
            _check_multiple_of(node, path)
        if ("pattern" in node or "format" in node) and (
                "minLength" in node or "maxLength" in node):
            raise _unsupported(f"minLength/maxLength together with pattern or format (at {path});"
                               " put the length bound into the pattern")
        if "allOf" in node and isinstance(node["allOf"], list):
            siblings = set(node) - _ANNOTATIONS - {"allOf"}
            if len(node["allOf"]) > 1 or siblings:
                raise _unsupported(f"allOf with several subschemas or beside other keywords "
                                   f"('allOf' at {path}); merge them into one schema")
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise GrammarError(f"json_schema: only local references ('#/...') are supported, "
                               f"got $ref {ref!r} at {path}", param="json_schema")
        pattern = node.get("pattern")
        if pattern is not None:
            check_regex(pattern, self.regex_limits, param="json_schema",
                        what=f"pattern at {path}")


# xgrammar's limits for integer multipleOf (larger values are silently dropped).
_MAX_MULTIPLE_OF = 1024
_MAX_MULTIPLE_OF_RANGE = 10_000


def _check_multiple_of(node: dict, path: str) -> None:
    step = node["multipleOf"]
    where = f"('multipleOf' at {path})"
    if node.get("type") != "integer":
        raise _unsupported(f"multipleOf without type integer {where}")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= _MAX_MULTIPLE_OF:
        raise _unsupported(f"multipleOf other than an integer in 1..{_MAX_MULTIPLE_OF} {where}")
    low = _bound(node, "minimum", "exclusiveMinimum", +1)
    high = _bound(node, "maximum", "exclusiveMaximum", -1)
    if low is None and high is None:
        return
    if low is None or high is None or high - low + 1 > _MAX_MULTIPLE_OF_RANGE:
        raise _unsupported(f"multipleOf with a range that is one-sided or spans more than "
                           f"{_MAX_MULTIPLE_OF_RANGE} integers {where}")


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


def _unsupported(what: str) -> GrammarError:
    return GrammarError(f"json_schema uses {what}, which constrained decoding cannot enforce",
                        param="json_schema")
