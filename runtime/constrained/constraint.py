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
    key: a digest of (kind, spec): a Constraint hashes and compares by it, so a cache keyed
    by Constraints (the compile cache) costs no pass over a long spec."""

    kind: str
    spec: str
    key: str

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constraint) and other.key == self.key
