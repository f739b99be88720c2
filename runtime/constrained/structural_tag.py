"""Structural tags: free text with tagged sections held to JSON Schemas (tool calls use
them), in xgrammar's format or SGLang's legacy one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..errors import GrammarError
from .limits import GrammarLimits
from .schema_check import parse_json_schema

# A schema's JSON text -> the schema checked and rewritten (parse_json_schema's result).
CheckSchema = Callable[[str], Any]


def parse_structural_tag(spec: str, limits: GrammarLimits,
                         check_schema: CheckSchema | None = None) -> dict:
    """A structural tag in xgrammar's format ({"type": "structural_tag", "format": ...}) or
    SGLang's legacy one ({"structures": [{"begin", "schema", "end"}], "triggers": [...]}),
    returned in xgrammar's format with each of its JSON Schemas checked and rewritten by
    `check_schema` (default: parse_json_schema); the rest of the structure is checked by
    xgrammar when it compiles."""
    if check_schema is None:
        def check_schema(text: str) -> Any:
            return parse_json_schema(text, limits.schema, limits.regex)

    if not isinstance(spec, str) or len(spec) > limits.schema.max_bytes:
        raise GrammarError(f"structural_tag must be a JSON string of at most "
                           f"{limits.schema.max_bytes} characters", param="structural_tag")
    try:
        tag = json.loads(spec)
    except (ValueError, RecursionError) as exc:
        raise GrammarError(f"structural_tag is not valid JSON: {exc}",
                           param="structural_tag") from None
    if not isinstance(tag, dict):
        raise GrammarError("structural_tag must be a JSON object", param="structural_tag")
    if "structures" in tag:
        tag = _from_legacy_structural_tag(tag)
    if tag.get("type") != "structural_tag" or not isinstance(tag.get("format"), dict):
        raise GrammarError('structural_tag needs "type": "structural_tag" and a "format" object',
                           param="structural_tag")
    # (all found before any is checked: a tag nested too deep is refused as that)
    for holder in _schema_formats(tag["format"], depth=0, max_depth=limits.schema.max_depth):
        holder["json_schema"] = check_schema(json.dumps(holder["json_schema"]))
    return tag


def _from_legacy_structural_tag(tag: dict) -> dict:
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if (not isinstance(structures, list) or not isinstance(triggers, list)
            or not all(isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys()
                       for s in structures)):
        raise GrammarError('structural_tag "structures" must be a list of {"begin", "schema", '
                           '"end"} objects, with a "triggers" list', param="structural_tag")
    tags = [{"type": "tag", "begin": s["begin"], "end": s["end"],
             "content": {"type": "json_schema", "json_schema": s["schema"]}} for s in structures]
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}


def _schema_formats(node: object, depth: int, max_depth: int) -> list[dict]:
    """Every {"type": "json_schema", "json_schema": {...}} format inside a structural tag."""
    if depth > max_depth:
        raise GrammarError(f"structural_tag nests deeper than {max_depth} levels",
                           param="structural_tag")
    found = []
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and isinstance(node.get("json_schema"), dict):
            found.append(node)
        children = [v for k, v in node.items() if k != "json_schema"]
    elif isinstance(node, list):
        children = node
    else:
        return found
    for child in children:
        found.extend(_schema_formats(child, depth + 1, max_depth))
    return found
