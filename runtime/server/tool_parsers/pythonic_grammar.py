"""The grammar of one pythonic tool's keyword arguments (`k1=v1, k2=v2`): each value by
xgrammar's grammar for its schema, with true/false/null written the Python way."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ...constrained.xgrammar_compat import fix_printed_grammar

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")
# The lookahead after a JSON string: an argument value is followed by ',' or ')'.
_STRING_LOOKAHEAD = ("[,}\\]:]", "[,}\\]:)]")


def python_literal(value: Any) -> str:
    """`value` (a JSON value) as Python source; strings keep JSON's quoting and escapes."""
    if isinstance(value, bool) or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(map(python_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)



@functools.lru_cache(maxsize=256)
def kwargs_grammar(schema_json: str) -> str:
    """EBNF for `k1=v1, k2=v2` from a checked object schema ("" when it has no properties):
    properties in declared order, the required ones present, each value its schema's."""
    schema = json.loads(schema_json)
    props = list((schema.get("properties") or {}).items())
    if not props:
        return ""
    required = set(schema.get("required") or [])
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    rules: dict[str, str] = {}
    for i, (_, sub) in enumerate(props):
        sub = {**defs, **sub} if isinstance(sub, dict) else sub
        rules.update(_value_rules(json.dumps(sub), f"p{i}_"))
    n = len(props)
    rules["root"] = "f0"
    rules[f"f{n}"] = rules[f"s{n}"] = '""'
    for i, (name, _) in enumerate(props):
        first, more = f'"{name}=" p{i}_root s{i + 1}', f'", {name}=" p{i}_root s{i + 1}'
        optional = name not in required
        rules[f"f{i}"] = f"({first}) | f{i + 1}" if optional else first
        rules[f"s{i}"] = f"({more}) | s{i + 1}" if optional else more
    return "\n".join(f"{k} ::= {v}" for k, v in rules.items()) + "\n"


def _value_rules(schema_json: str, prefix: str) -> dict[str, str]:
    """xgrammar's rules for a JSON Schema with Python's True/False/None, its rules renamed with
    `prefix` (the basic_* ones, the same in every value, are shared)."""
    from ...constrained.grammar_build import json_schema_grammar  # (xgrammar: loaded on use)

    text = fix_printed_grammar(str(json_schema_grammar(schema_json)))
    parsed = [_RULE.match(line) for line in text.splitlines() if line.strip()]
    if not all(parsed):
        raise ValueError("cannot read xgrammar's grammar for an argument")
    names = {m.group(1) for m in parsed}
    rename = {name: name if name.startswith("basic_") else prefix + name for name in names}
    return {rename[m.group(1)]: _rewrite_body(m.group(2), rename) for m in parsed}


def _rewrite_body(body: str, rename: dict[str, str]) -> str:
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch in "\"[":
            end = _token_end(body, i)
            token = body[i:end]
            out.append(_python_literal_token(token) if ch == '"' else
                       _STRING_LOOKAHEAD[1] if token == _STRING_LOOKAHEAD[0] else token)
            i = end
            continue
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(body, i)
        if match:
            out.append(rename.get(match.group(), match.group()))
            i = match.end()
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _token_end(body: str, start: int) -> int:
    """The end of the string literal or character class starting at `start`."""
    close = '"' if body[start] == '"' else "]"
    i = start + 1
    while i < len(body) and body[i] != close:
        i += 2 if body[i] == "\\" else 1
    return i + 1


def _python_literal_token(token: str) -> str:
    """An EBNF literal holding JSON with true/false/null, rewritten the Python way."""
    try:
        value = json.loads(json.loads(token))
    except ValueError:
        return token
    if not _has_keyword(value):
        return token
    return json.dumps(python_literal(value), ensure_ascii=False)


def _has_keyword(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, list):
        return any(map(_has_keyword, value))
    if isinstance(value, dict):
        return any(map(_has_keyword, value.values()))
    return False


