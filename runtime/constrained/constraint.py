"""Constraint: a regex / JSON Schema / EBNF / choices / structural-tag constraint as the front
door (front_door.prepare) left it: checked, rewritten, and normalised to the text xgrammar
compiles. Frozen and msgspec-encodable, so it travels from the HTTP process to the scheduler
inside GenerateReq, where it is compiled as it is, without a second check."""

from __future__ import annotations

import msgspec


class Constraint(msgspec.Struct, frozen=True):
    """kind: one of limits.KINDS, as the client asked for it (it names the field in errors).
    spec: what grammar_build compiles for `kind`: the regex normalised (normalize_regex), the
    schema rewritten (xgrammar_compat), the choices as an EBNF grammar, the structural tag in
    xgrammar's format with its schemas rewritten; for json_object, '{"type": "object"}'.
    key: a short digest of (kind, spec), equal exactly for equal constraints (cache keys)."""

    kind: str
    spec: str
    key: str
