"""Walks a (rewritten) JSON Schema document once, checking each subschema: its shape, the
refusals of xgrammar_compat, local $refs, oneOf overlaps and the pattern-matching budget."""

from __future__ import annotations

from typing import Any

from ..errors import GrammarError
from .limits import RegexLimits, SchemaLimits
from .regex_check import check_regex
from .schema_errors import refuse
from .schema_terms import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES, pointer_token, resolve_ref
from .xgrammar_compat.keyword_checks import (
    check_array,
    check_combinators,
    check_object,
    check_ref_siblings,
    check_value_keywords,
    one_of_overlap_error,
)
from .xgrammar_compat.one_of import OneOfOverlap


def too_many_subschemas(limits: SchemaLimits) -> GrammarError:
    return GrammarError(f"json_schema has more than {limits.max_subschemas} subschemas "
                        "(limit max_subschemas)", param="json_schema")


class SchemaWalker:
    def __init__(self, limits: SchemaLimits, regex_limits: RegexLimits, root: Any):
        self.limits = limits
        self.regex_limits = regex_limits
        self.root = root
        self.num_subschemas = 0
        self.paths: dict[int, str] = {}  # id(subschema) -> its path
        self.overlap = OneOfOverlap(root, limits.max_overlap_steps)
        self.pattern_matches = 0

    def visit(self, node: Any, path: str) -> None:
        self.num_subschemas += 1
        if self.num_subschemas > self.limits.max_subschemas:
            raise too_many_subschemas(self.limits)
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise GrammarError(f"json_schema: the schema at {path} must be an object or a "
                               f"boolean, not {type(node).__name__}", param="json_schema")
        self.paths.setdefault(id(node), path)
        self._check_keywords(node, path)
        for key in SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                for name, sub in node[key].items():
                    if key == "patternProperties":
                        check_regex(name, self.regex_limits, param="json_schema",
                                    what=f"property pattern at {path}/{key}")
                    self.visit(sub, f"{path}/{key}/{pointer_token(name)}")
        for key in SCHEMA_VALUES:
            if key in node:
                value = node[key]
                subs = value if isinstance(value, list) else [value]
                for i, sub in enumerate(subs):
                    self.visit(sub, f"{path}/{key}" + (f"/{i}" if isinstance(value, list) else ""))
        for key in SCHEMA_LISTS:
            if key in node:
                if not isinstance(node[key], list) or not node[key]:
                    raise GrammarError(f"json_schema: {key} at {path} must be a non-empty list",
                                       param="json_schema")
                for i, sub in enumerate(node[key]):
                    self.visit(sub, f"{path}/{key}/{i}")

    def _check_keywords(self, node: dict, path: str) -> None:
        check_value_keywords(node, path, self.regex_limits)
        self._check_ref(node, path)
        check_combinators(node, path)
        if isinstance(node.get("oneOf"), list):
            overlap = self.overlap.find(node["oneOf"], path)
            if overlap is not None:
                raise one_of_overlap_error(path, *overlap)
        self._check_object(node, path)
        check_array(node, path)

    def _check_object(self, node: dict, path: str) -> None:
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and isinstance(node.get("properties"), dict):
            self.pattern_matches += len(patterns) * len(node["properties"])
            if self.pattern_matches > self.limits.max_pattern_matches:
                raise refuse("patternProperties", path, "and 'properties' make more than "
                             f"{self.limits.max_pattern_matches} (pattern, name) pairs to "
                             "check (limit max_pattern_matches); use fewer patterns")
        check_object(node, path)

    def _check_ref(self, node: dict, path: str) -> None:
        if "$ref" not in node:
            return
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"json_schema: only local references ('#/...') are supported, "
                               f"got $ref {ref!r} at {path}", param="json_schema")
        if resolve_ref(self.root, ref) is None:
            raise refuse("$ref", path, f"names {ref!r}, which is not in the document")
        check_ref_siblings(node, path)
