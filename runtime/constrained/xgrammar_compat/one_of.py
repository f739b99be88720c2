"""oneOf is exact only when no value can match two branches: xgrammar reads oneOf as anyOf.
OneOfOverlap finds two branches of a oneOf that one value may match, in near-linear time."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from ...errors import GrammarError
from ..schema_terms import ALL_KINDS, deref, json_key, listed_values
from .shapes import Shape, below, disjoint, key_kind, least, low_key, numeric_bound

_SHAPE_DEPTH = 8


class OneOfOverlap:
    """Finds two branches of a oneOf that one value may match (xgrammar reads oneOf as
    anyOf). Near-linear: listed values are indexed (a hash for values, sorted lists for
    numbers), number ranges swept in order, tagged objects grouped by tag value; only the
    pairs these cannot tell apart are compared, each counting against `max_steps`, which
    bounds the whole document's analysis. Shapes are memoized, so shared $refs cost once."""

    def __init__(self, root: Any, max_steps: int):
        self.root = root
        self.max_steps = max_steps
        self.steps = 0
        self.path = "#"
        self._shapes: dict[tuple[int, int], Shape] = {}
        self._keys: dict[int, frozenset] = {}
        self._keep: list = []  # the nodes memoized by id stay alive

    def find(self, branches: list, path: str) -> tuple[int, int] | None:
        self.path = path
        shapes = [self.shape(b) for b in branches]
        listed = [i for i, s in enumerate(shapes) if s.values is not None]
        others = [i for i, s in enumerate(shapes) if s.values is None]
        found = [p for p in (self._listed_pair(shapes, listed),
                             self._listed_other_pair(shapes, listed, others),
                             self._other_pair(shapes, others)) if p is not None]
        return min((min(p), max(p)) for p in found) if found else None

    def charge(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.max_steps:
            raise GrammarError(
                f"json_schema: 'oneOf' at {self.path}/oneOf makes checking that its branches "
                f"are disjoint take more than {self.max_steps} steps (limit max_overlap_steps); "
                "use fewer or simpler branches, or anyOf", param="json_schema")

    # ---- shapes ----

    def shape(self, node: Any, depth: int = 0) -> Shape:
        node = deref(node, self.root)
        memo = (id(node), depth)
        shape = self._shapes.get(memo)
        if shape is None:
            self.charge(1)
            shape = self._shapes[memo] = self._shape(node, depth)
            self._keep.append(node)
        return shape

    def _shape(self, node: Any, depth: int) -> Shape:
        if not isinstance(node, dict) or depth > _SHAPE_DEPTH:
            return Shape(frozenset() if node is False else ALL_KINDS)
        values = self.keys(node)
        if values is not None:
            return Shape(frozenset(key_kind(k) for k in values), values)
        types = node.get("type")
        types = [types] if isinstance(types, str) else types
        if isinstance(types, list):
            kinds = frozenset("number" if t == "integer" else t for t in types)
        elif isinstance(node.get("anyOf") or node.get("oneOf"), list):
            subs = [self.shape(b, depth + 1) for b in node.get("anyOf") or node["oneOf"]]
            return Shape(frozenset().union(*(s.kinds for s in subs)))
        else:
            kinds = ALL_KINDS
        return Shape(kinds, low=numeric_bound(node, "minimum", "exclusiveMinimum", max),
                     high=numeric_bound(node, "maximum", "exclusiveMaximum", min),
                     integer=isinstance(types, list) and "number" not in types,
                     tags=self._tags(node))

    def keys(self, node: Any) -> frozenset | None:
        """json_key of each value an enum/const-only schema lists (None for other schemas)."""
        if id(node) in self._keys:
            return self._keys[id(node)]
        values = listed_values(node)
        if values is None:
            return None
        self.charge(len(values))
        keys = self._keys[id(node)] = frozenset(json_key(v) for v in values)
        self._keep.append(node)
        return keys

    def _tags(self, node: dict) -> dict:
        props = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        tags = {}
        for name in required:
            keys = self.keys(deref(props.get(name), self.root)) if isinstance(name, str) \
                else None
            if keys is not None:
                tags[name] = keys
        return tags

    # ---- pairs ----

    def _listed_pair(self, shapes: list[Shape], listed: list[int]) -> tuple | None:
        """Two enum/const branches listing one value."""
        owner: dict = {}
        for i in listed:
            self.charge(len(shapes[i].values))
            for key in shapes[i].values:
                j = owner.setdefault(key, i)
                if j != i:
                    return j, i
        return None

    def _listed_other_pair(self, shapes: list[Shape], listed: list[int],
                           others: list[int]) -> tuple | None:
        """An enum/const branch listing a value that another branch admits."""
        if not listed or not others:
            return None
        kind_owner: dict[str, int] = {}  # kind other than number -> first branch listing one
        numbers: list[tuple] = []  # (value, branch)
        integers: list[tuple] = []
        for i in listed:
            self.charge(len(shapes[i].values))
            for key in shapes[i].values:
                kind = key_kind(key)
                if kind != "number":
                    kind_owner.setdefault(kind, i)
                else:
                    numbers.append((key[1], i))
                    if isinstance(key[1], int) or key[1].is_integer():
                        integers.append((key[1], i))
        numbers.sort(key=lambda item: item[0])
        integers.sort(key=lambda item: item[0])
        num_values = [v for v, _ in numbers]
        int_values = [v for v, _ in integers]
        best = None
        for y in others:
            self.charge(1)
            shape = shapes[y]
            for kind in shape.kinds:
                if kind != "number" and kind in kind_owner:
                    best = least(best, (kind_owner[kind], y))
            if "number" in shape.kinds:
                values, items = (int_values, integers) if shape.integer else (num_values,
                                                                              numbers)
                start = 0 if shape.low is None else (
                    bisect_right if shape.low[1] else bisect_left)(values, shape.low[0])
                end = len(values) if shape.high is None else (
                    bisect_left if shape.high[1] else bisect_right)(values, shape.high[0])
                if start < end:
                    best = least(best, (min(i for _, i in items[start:end]), y))
                    self.charge(end - start)
        return best

    def _other_pair(self, shapes: list[Shape], others: list[int]) -> tuple | None:
        """Two branches, neither a list of values, that one value may match."""
        groups: dict[frozenset, list[int]] = {}
        for i in others:
            groups.setdefault(shapes[i].kinds, []).append(i)
        kinds = list(groups)
        best = None
        for a, ka in enumerate(kinds):
            for kb in kinds[a:]:
                common = ka & kb
                same = ka == kb
                if not common or (same and len(groups[ka]) < 2):
                    continue
                self.charge(1)
                if common == {"number"}:
                    pair = self._ranges_pair(shapes, groups[ka], None if same else groups[kb])
                elif common == {"object"}:
                    pair = self._objects_pair(shapes, groups[ka], None if same else groups[kb])
                else:  # a value of a common kind that neither ranges nor tags tell apart
                    pair = tuple(groups[ka][:2]) if same else (groups[ka][0], groups[kb][0])
                best = least(best, pair)
        return best

    def _ranges_pair(self, shapes: list[Shape], first: list[int],
                     second: list[int] | None) -> tuple | None:
        """Number branches whose ranges meet: a sweep in order of lower bounds, comparing
        each range with the ones that start before it ends."""
        side = {i: 0 for i in first} | {i: 1 for i in second or ()}
        order = sorted(side, key=lambda i: low_key(shapes[i].low))
        best = None
        for n, a in enumerate(order):
            for b in order[n + 1:]:
                self.charge(1)
                if below(shapes[a].high, shapes[b].low):
                    break  # b and every later range start after a ends
                if (second is None or side[a] != side[b]) and not disjoint(shapes[a],
                                                                           shapes[b]):
                    best = least(best, (a, b))
                    break
        return best

    def _objects_pair(self, shapes: list[Shape], first: list[int],
                      second: list[int] | None) -> tuple | None:
        """Object branches that no required property's listed values tell apart. Branches
        are grouped by the values of the most common tag: two with no value in common differ
        there; the rest are compared."""
        side = {i: 0 for i in first} | {i: 1 for i in second or ()}
        members = sorted(side)
        counts: dict[str, int] = {}
        for i in members:
            for name in shapes[i].tags or ():
                counts[name] = counts.get(name, 0) + 1
        self.charge(len(members) + len(counts))
        tag = max(counts, key=lambda name: (counts[name], name)) if counts else None
        by_value: dict = {}
        untagged = []
        for i in members:
            tags = shapes[i].tags or {}
            if tag in tags:
                self.charge(len(tags[tag]))
                for key in tags[tag]:
                    by_value.setdefault(key, []).append(i)
            else:
                untagged.append(i)
        seen: set = set()

        def overlap(a: int, b: int) -> bool:
            a, b = min(a, b), max(a, b)
            if a == b or (a, b) in seen or (second is not None and side[a] == side[b]):
                return False
            seen.add((a, b))
            self.charge(1)
            return not self._tagsdisjoint(shapes[a], shapes[b])

        for a in untagged:
            for b in members:
                if overlap(a, b):
                    return a, b
        for group in by_value.values():
            for n, a in enumerate(group):
                for b in group[n + 1:]:
                    if overlap(a, b):
                        return a, b
        return None

    def _tagsdisjoint(self, a: Shape, b: Shape) -> bool:
        if not (a.tags and b.tags):
            return False
        for name, keys in a.tags.items():
            if name in b.tags:
                self.charge(min(len(keys), len(b.tags[name])))
                if not keys & b.tags[name]:
                    return True
        return False

