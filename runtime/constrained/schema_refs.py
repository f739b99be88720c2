"""$ref cycles and unending schemas: refuses $ref cycles that never enter an object or array
(validating them never ends; xgrammar loops or errs) and subschemas that admit no finite value
(a required property that refers back to its own schema), where the masks would never let the
output end."""

from __future__ import annotations

from typing import Any

from ..errors import GrammarError
from .schema_errors import refuse
from .schema_terms import SCHEMA_VALUES, resolve_ref


class RefGraph:
    """The subschemas reachable from the root, joined by $ref and by nesting (`paths`: the
    walker's id(subschema) -> JSON path, for messages)."""
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
            raise refuse("$ref", max(stuck, key=lambda p: (p.count("/"), p)), "leads to a "
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
            for key in SCHEMA_VALUES:
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
                    raise refuse("$ref", self._ref_on(stack), "closes a cycle that never "
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
