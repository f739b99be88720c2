"""Checks a JSON Schema before compilation: the cheap size and depth caps first, then the
rewrites (xgrammar_compat.schema_rewrite), then one walk refusing every keyword that xgrammar's
token masks do not enforce exactly (schema_walk.py), then $ref cycles (schema_refs.py), so
that every output the masks allow validates."""

from __future__ import annotations

import json
from typing import Any

from ..errors import GrammarError
from .limits import RegexLimits, SchemaLimits
from .schema_refs import RefGraph
from .schema_terms import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES
from .schema_walk import SchemaWalker, too_many_subschemas
from .xgrammar_compat import rewrite_schema


def parse_json_schema(spec: str, limits: SchemaLimits, regex_limits: RegexLimits) -> Any:
    """Parse, rewrite and check a schema document; return the rewritten schema, the one to
    compile. Raise GrammarError naming the problem."""
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
    walker = SchemaWalker(limits, regex_limits, schema)
    walker.visit(schema, "#")
    RefGraph(schema, walker.paths).check()
    return schema


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _count_subschemas(doc: Any, limits: SchemaLimits) -> None:
    """The subschema and branch caps, in one linear pass over the document (the walker's
    keywords), before any analysis that could cost more."""
    count, stack, widest = 0, [doc], None
    while stack:
        node = stack.pop()
        count += 1
        if count > limits.max_subschemas:
            raise too_many_subschemas(limits)
        if not isinstance(node, dict):
            continue
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend(node[key].values())
        for key in SCHEMA_VALUES:
            if key in node:
                value = node[key]
                stack.extend(value if isinstance(value, list) else [value])
        for key in SCHEMA_LISTS:
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
