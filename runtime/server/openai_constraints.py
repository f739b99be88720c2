"""The one output constraint of an OpenAI request, whichever names the client used for it.

OpenAI's `response_format`, SGLang's `regex` / `ebnf` / `json_schema` fields, vLLM's
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` and `structured_outputs`,
and tool calls each become SamplingParams' constraint fields; a request that names two
constraints is a 400 naming both.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InvalidRequest

# vLLM's guided_decoding_backend values that mean what radixflow does (xgrammar).
_BACKENDS = frozenset({"xgrammar", "auto"})
_ANY_OBJECT = json.dumps({"type": "object"})


def constraint_fields(body: Any, tool_fields: dict | None = None) -> dict[str, Any]:
    """The sampling fields ({"regex": ...}, {"json_schema": ...}, ...) of `body`'s constraint,
    or {} when it has none. `tool_fields`: the constraint its tools ask for, if any."""
    _check_backend(body.guided_decoding_backend)
    found = [*_sglang_names(body), *_vllm_names(body), *_response_format(body)]
    if tool_fields:
        found.append(("tools", tool_fields))
    if len(found) > 1:
        names = [where for where, _ in found]
        hint = ' (tools constrain the output unless tool_choice is "none")' \
            if "tools" in names else ""
        raise InvalidRequest(f"a request takes one output constraint; this one has {names}"
                             f"{hint}", param=names[1])
    return found[0][1] if found else {}


def _json_text(schema: str | dict) -> str:
    return schema if isinstance(schema, str) else json.dumps(schema)


def _sglang_names(body: Any) -> list[tuple[str, dict]]:
    out = []
    if body.regex is not None:
        out.append(("regex", {"regex": body.regex}))
    if body.ebnf is not None:
        out.append(("ebnf", {"ebnf": body.ebnf}))
    if body.json_schema is not None:
        out.append(("json_schema", {"json_schema": _json_text(body.json_schema)}))
    return out


def _vllm_names(body: Any) -> list[tuple[str, dict]]:
    out = []
    if body.guided_json is not None:
        out.append(("guided_json", {"json_schema": _json_text(body.guided_json)}))
    if body.guided_regex is not None:
        out.append(("guided_regex", {"regex": body.guided_regex}))
    if body.guided_choice is not None:
        out.append(("guided_choice", {"choices": body.guided_choice}))
    if body.guided_grammar is not None:
        out.append(("guided_grammar", {"ebnf": body.guided_grammar}))
    so = body.structured_outputs
    if so is not None:
        where = "structured_outputs."
        if so.json_ is not None:
            out.append((where + "json", {"json_schema": _json_text(so.json_)}))
        if so.regex is not None:
            out.append((where + "regex", {"regex": so.regex}))
        if so.choice is not None:
            out.append((where + "choice", {"choices": so.choice}))
        if so.grammar is not None:
            out.append((where + "grammar", {"ebnf": so.grammar}))
        if so.structural_tag is not None:
            out.append((where + "structural_tag",
                        {"structural_tag": _json_text(so.structural_tag)}))
        if so.json_object:
            out.append((where + "json_object", {"json_schema": _ANY_OBJECT}))
    return out


def _response_format(body: Any) -> list[tuple[str, dict]]:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [("response_format", {"json_schema": _ANY_OBJECT})]
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise InvalidRequest("response_format of type json_schema needs json_schema.schema",
                             param="response_format.json_schema")
    return [("response_format", {"json_schema": json.dumps(fmt.json_schema.schema_)})]


def _check_backend(name: str | None) -> None:
    if name is not None and name.split(":")[0] not in _BACKENDS:
        raise InvalidRequest(f"guided_decoding_backend {name!r} is not available: radixflow "
                             f"constrains with xgrammar (use 'xgrammar' or 'auto')",
                             param="guided_decoding_backend")
