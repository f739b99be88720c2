"""The front door of every constraint: `prepare(kind, spec)` parses, rewrites and checks a
regex / JSON Schema / EBNF / choices / structural tag once and returns the Constraint that the
scheduler compiles as it is. The HTTP routes, the tool-call path, /program (through /generate),
the in-process Engine and the DSL all come in here; nothing after it checks again.

Pure Python + interegular. Prepared constraints (and refusals) are kept in a thread-safe LRU
keyed by (kind, sha256 of the raw spec, limits), so a repeat costs a hash and a lookup and
concurrent calls for one constraint share one run. A first call on a large schema is the
costly one (bench/results/attacks.md times the worst accepted ones, compile included): call it
off the event loop (`await asyncio.to_thread(prepare, kind, spec)`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future

from ..errors import GrammarError
from .constraint import Constraint
from .kinds import check_ebnf, choices_to_ebnf, parse_choices
from .limits import KINDS, GrammarLimits
from .regex_check import check_regex, normalize_regex
from .schema_check import parse_json_schema
from .structural_tag import parse_structural_tag

JSON_OBJECT_SPEC = '{"type": "object"}'
# The LRU's bounds: prepared constraints hold their normalised spec (up to ~64 KB each).
PREPARED_CACHE_ENTRIES = 4096
PREPARED_CACHE_BYTES = 64 * 1024 * 1024
# Specs longer than this are prepared uncached (the length limits refuse them at once).
_MAX_CACHED_SPEC = 1024 * 1024

_prepared: OrderedDict[tuple, Future] = OrderedDict()  # of Constraint, or the GrammarError
_sizes: dict[tuple, int] = {}
_lock = threading.Lock()


def prepare(kind: str, spec: str, limits: GrammarLimits | None = None) -> Constraint:
    """The constraint checked, rewritten and normalised (Constraint's fields say to what).

    kind is one of KINDS; spec is the regex, the schema as a JSON string, the EBNF grammar, the
    choices as a JSON list of strings, or an xgrammar / SGLang structural tag as a JSON string
    (spec is ignored for "json_object"). Raises GrammarError (a 400) naming the problem, a
    fresh one each time. Thread-safe, cached (module docstring)."""
    limits = limits or GrammarLimits()
    if not isinstance(spec, str) or len(spec) > _MAX_CACHED_SPEC:
        return prepare_uncached(kind, spec, limits)
    digest = hashlib.sha256(spec.encode("utf-8", "surrogatepass")).digest()
    key = (kind, digest, limits)
    with _lock:
        entry = _prepared.get(key)
        owner = entry is None
        if owner:
            entry = _prepared[key] = Future()
            _sizes[key] = 0
            _evict()
        else:
            _prepared.move_to_end(key)
    if owner:
        _run(key, entry, kind, spec, limits)
    outcome = entry.result()
    if isinstance(outcome, GrammarError):
        raise type(outcome)(outcome.message, param=outcome.param) from None
    return outcome


def validate_constraint(kind: str, spec: str, limits: GrammarLimits | None = None) -> None:
    """prepare's checks, uncached: raise GrammarError (a 400) if the constraint is invalid,
    unsupported or too big."""
    prepare_uncached(kind, spec, limits or GrammarLimits())


def clear_prepared() -> None:
    """Forget every prepared constraint (tests)."""
    with _lock:
        _prepared.clear()
        _sizes.clear()


def _run(key: tuple, entry: Future, kind: str, spec: str, limits: GrammarLimits) -> None:
    try:
        outcome: Constraint | GrammarError = prepare_uncached(kind, spec, limits)
    except GrammarError as exc:
        outcome = exc
    except BaseException as exc:  # a bug, not a verdict: not cached
        with _lock:
            if _prepared.get(key) is entry:
                del _prepared[key]
                _sizes.pop(key, None)
        entry.set_exception(exc)
        raise
    with _lock:
        if _prepared.get(key) is entry:
            _sizes[key] = len(outcome.spec) if isinstance(outcome, Constraint) else 0
            _evict()
    entry.set_result(outcome)


def _evict() -> None:
    """Drop the least recently used entries beyond the count or byte budget (lock held)."""
    total = sum(_sizes.values())
    while _prepared and (len(_prepared) > PREPARED_CACHE_ENTRIES
                         or total > PREPARED_CACHE_BYTES):
        key, _ = _prepared.popitem(last=False)
        total -= _sizes.pop(key, 0)


def prepare_uncached(kind: str, spec: str, limits: GrammarLimits) -> Constraint:
    """prepare without the cache (a structural tag's schemas still go through it)."""
    normalised = _normalise(kind, spec, limits)
    digest = hashlib.sha256(normalised.encode("utf-8", "surrogatepass")).hexdigest()
    return Constraint(kind=kind, spec=normalised, key=f"{kind}:{digest[:32]}")


def _normalise(kind: str, spec: str, limits: GrammarLimits) -> str:
    if kind == "regex":
        check_regex(spec, limits.regex)
        return normalize_regex(spec)
    if kind == "json_schema":
        return json.dumps(parse_json_schema(spec, limits.schema, limits.regex))
    if kind == "json_object":
        return JSON_OBJECT_SPEC
    if kind == "ebnf":
        check_ebnf(spec, limits.max_ebnf_length, limits.max_ebnf_rules)
        return spec
    if kind == "choices":
        return choices_to_ebnf(parse_choices(spec, limits))
    if kind == "structural_tag":
        # Its schemas come in through the front door too: a tool's parameters schema, checked
        # when the tools were, is a cache hit here.
        def check_schema(text: str) -> object:
            return json.loads(prepare("json_schema", text, limits).spec)

        return json.dumps(parse_structural_tag(spec, limits, check_schema))
    raise GrammarError(f"unknown constraint kind {kind!r}; expected one of {', '.join(KINDS)}")
