"""The shape of a oneOf branch (its JSON types, listed values, number range, tags) and how two
shapes compare, for one_of.py."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Shape:
    kinds: frozenset  # JSON types a value may have ("number" covers "integer")
    values: set | None = None  # json_key of every admitted value, when listed
    low: tuple | None = None  # (bound, exclusive) for numbers
    high: tuple | None = None
    integer: bool = False
    tags: dict | None = None  # required property -> json_keys of its listed values


def least(best: tuple | None, pair: tuple | None) -> tuple | None:
    if pair is None:
        return best
    pair = (min(pair), max(pair))
    return pair if best is None or pair < best else best


def low_key(low: tuple | None) -> tuple:
    """Lower bounds in increasing order: none first, and an inclusive bound before an
    exclusive one at the same number (as below() compares them)."""
    return (0,) if low is None else (1, low[0], low[1])


def key_kind(key: tuple) -> str:
    if key[0] == "literal":
        return "null" if key[1] is None else "boolean"
    return key[0]


def numeric_bound(node: dict, inclusive: str, exclusive: str, tighter) -> tuple | None:
    bounds = [(node[k], k == exclusive) for k in (inclusive, exclusive)
              if isinstance(node.get(k), (int, float)) and not isinstance(node[k], bool)]
    if not bounds:
        return None
    best = tighter(b[0] for b in bounds)
    return best, any(b == (best, True) for b in bounds)


def disjoint(a: Shape, b: Shape) -> bool:
    """Whether no value matches both of two shapes that list no values."""
    common = a.kinds & b.kinds
    if not common:
        return True
    return common == {"number"} and (below(a.high, b.low) or below(b.high, a.low))


def below(high: tuple | None, low: tuple | None) -> bool:
    """Whether every number under `high` is under `low` too: the ranges do not meet."""
    if high is None or low is None:
        return False
    return high[0] < low[0] or (high[0] == low[0] and (high[1] or low[1]))
