"""JSON Schema's vocabulary, as the checks and rewrites read it: which keywords hold subschemas,
which assert, how values compare, and how a local $ref resolves. Nothing here is about
xgrammar (that is xgrammar_compat's)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

# Keywords whose value is a map of name -> subschema.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# Keywords whose value is one subschema (or, for draft-7 `items`, a list of them).
SCHEMA_VALUES = ("items", "additionalProperties", "propertyNames",
                 "unevaluatedItems", "unevaluatedProperties", "additionalItems")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
# Every keyword that constrains a value (the rest are annotations or unknown, which JSON
# Schema ignores).
ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
    "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
    "dependentRequired", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "dependentSchemas", "prefixItems", "items", "contains", "properties", "patternProperties",
    "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
    "$ref", "$dynamicRef", "$recursiveRef", "additionalItems", "dependencies"})
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$schema", "$id", "discriminator",
                         "contentEncoding", "contentMediaType", "contentSchema"})
ALL_KINDS = frozenset({"null", "boolean", "number", "string", "array", "object"})


def assertions(node: dict, *besides: str) -> list[str]:
    """The asserting keywords of `node`, sorted, leaving out `besides`."""
    return sorted((set(node) & ASSERTIONS) - set(besides))


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


def deref(node: Any, root: Any) -> Any:
    """`node` with $refs and one-branch allOfs followed (at most 64 of them)."""
    for _ in range(64):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            node = resolve_ref(root, node["$ref"])
        elif isinstance(node, dict) and isinstance(node.get("allOf"), list) and len(
                node["allOf"]) == 1:
            node = node["allOf"][0]
        else:
            return node
    return node
