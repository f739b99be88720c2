"""Completions of a grammar state: byte strings that take a GrammarMatcher to a complete match.

    alphabet = byte_alphabet(compiled.grammar)       # alphabet.py: a byte per class it tells apart
    shortest_completion(matcher, alphabet)           # b'", "age": 0}' (best-first search)
    greedy_completion(matcher, alphabet, 256)        # a completion, closers first (cheap)

Neither changes `matcher`. Every string either returns is a real path through the matcher
(built by accepting it), so it always completes the grammar; only its length may be more than
the least possible (see shortest_completion for when).
"""

from __future__ import annotations

import heapq
import re
from typing import Any

from .alphabet import Alphabet

_ITEM = re.compile(r"rule_id=(-?\d+), sequence_id=(-?\d+), element_id=(-?\d+), "
                   r"rule_start_pos=(-?\d+), sub_element_id=(-?\d+)")
_STEPS = re.compile(r"There are (\d+) steps")


def greedy_completion(matcher: Any, alphabet: Alphabet, max_bytes: int) -> bytes | None:
    """A completion found by taking, at each step, the forced text or else the first byte in
    `alphabet.greedy` order (closers first) that leaves the current rule's loop and does not
    repeat a short cycle a third time ('}.}.}.'). None when none is found within
    `max_bytes`."""
    probe = matcher.fork()
    out = bytearray()
    while not probe.is_completed():
        forced = probe.find_jump_forward_string()
        if forced and probe.accept_string(forced):
            out += forced.encode("utf-8", errors="surrogatepass")
        else:
            step = _greedy_step(probe, alphabet, out)
            if step is None:
                return None
            out += step
        if len(out) > max_bytes:
            return None
    return bytes(out)


def _greedy_step(probe: Any, alphabet: Alphabet, out: bytearray) -> bytes | None:
    """The first representative that neither loops (_is_loop: more of the same string) nor
    cycles; else the first that only loops; else the first that cycles."""
    here = probe._debug_print_internal_state()
    looping, cycling = None, []
    for rep in alphabet.greedy:
        if _cycles(out, rep):
            cycling.append(rep)
            continue
        if not probe.accept_string(rep):
            continue
        if not _is_loop(here, probe._debug_print_internal_state(), alphabet.counted):
            return rep
        probe.rollback(1)
        looping = looping or rep
    for rep in ([looping] if looping else []) + cycling:
        if probe.accept_string(rep):
            return rep
    return None


def _cycles(out: bytearray, rep: bytes) -> bool:
    """Whether out + rep ends with three copies of a 1- to 8-byte pattern."""
    tail = bytes(out[-23:]) + rep
    return any(len(tail) >= 3 * p and tail[-3 * p:] == tail[-p:] * 3 for p in range(1, 9))


def shortest_completion(matcher: Any, alphabet: Alphabet, *, upper: int | None = None,
                        max_expansions: int = 1024) -> bytes | None:
    """The shortest completion, by a best-first search over the alphabet's representatives
    (a forced text is one edge). None if none is found shorter than `upper` bytes within
    `max_expansions` expanded states.

    Two children of one state that reach the same parser state are one child; a first pass
    also skips a child whose parser items equal its parent's, one byte on ("a loop": more of
    a string, a number, a repeated element). If that pass finds nothing, a second pass keeps
    the loops (a minimum count may need them). Exact for grammars whose parser state the
    debug print shows in full; otherwise a completion no longer than the greedy one.
    """
    found = _search(matcher, alphabet, upper, max_expansions, skip_loops=True)
    if found is None:
        found = _search(matcher, alphabet, upper, max_expansions // 2, skip_loops=False)
    return found


def _search(matcher: Any, alphabet: Alphabet, upper: int | None, max_expansions: int, *,
            skip_loops: bool) -> bytes | None:
    best = upper if upper is not None else 1 << 30
    heap = [(0, 0, b"", matcher.fork())]
    seen: set[str] = set()
    counter = 1
    for _ in range(max_expansions):
        if not heap:
            return None
        cost, _, path, node = heapq.heappop(heap)
        if node.is_completed():
            return path
        for edge, child in _children(node, alphabet, skip_loops):
            key = child._debug_print_internal_state()
            if cost + len(edge) >= best or key in seen:
                continue
            seen.add(key)
            heapq.heappush(heap, (cost + len(edge), counter, path + edge, child))
            counter += 1
    return None


def _children(node: Any, alphabet: Alphabet, skip_loops: bool) -> list[tuple[bytes, Any]]:
    """(edge, matcher after it): the forced text, or one child per distinct parser state."""
    forced = node.find_jump_forward_string()
    if forced:
        child = node.fork()
        if child.accept_string(forced):
            return [(forced.encode("utf-8", errors="surrogatepass"), child)]
    here = node._debug_print_internal_state()
    out, states = [], set()
    for rep in alphabet.reps:
        if not node.accept_string(rep):
            continue
        state = node._debug_print_internal_state()
        items = _items(state)
        if items not in states and not (skip_loops and _is_loop(here, state, alphabet.counted)):
            states.add(items)
            out.append((rep, node.fork()))
        node.rollback(1)
    return out


def _items(state: str) -> str:
    """The parser items of a debug print, without the step count heading it."""
    return state.split("\n", 1)[-1]


def _is_loop(parent: str, child: str, counted: frozenset[int]) -> bool:
    """The child (one byte on) has its parent's parser items, with rules started at the
    parent's step or later shifted by that byte: more of a string, of a number, of a repeated
    element."""
    base = _step(parent)
    return base >= 0 and _signature(parent, base, counted) == _signature(child, base, counted)


def _step(state: str) -> int:
    """The step of a debug print (bytes accepted so far); -1 if it has no heading."""
    heading = _STEPS.match(state)
    return int(heading.group(1)) - 1 if heading else -1


def _signature(state: str, base: int, counted: frozenset[int]) -> tuple:
    """The parser items of a debug print, each rule started at `base` or later counted back
    from the state's own step: two states with one signature differ only in how long ago
    such rules started. Not for rules repeated a minimum number of times (`counted`): the
    print does not show the count, so their starts stay absolute."""
    now = _step(state)
    if now < 0:
        return (state,)
    items = []
    for rule, sequence, element, start, sub in _ITEM.findall(state):
        begin: int | tuple = int(start)
        if begin >= base and int(rule) not in counted:
            begin = ("ago", now - begin)
        items.append((rule, sequence, element, begin, sub))
    return tuple(items)
