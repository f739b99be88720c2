"""Structured generation: regex, JSON Schema, EBNF, choices and structural-tag constraints
over xgrammar.

    backend = GrammarBackend(tokenizer, vocab_size)      # one per tokenizer
    state = backend.new_state(backend.compile("regex", r"\\d{4}-\\d{2}-\\d{2}"))
    bitmask = backend.allocate_bitmask(bs)                # [bs, ceil(vocab / 32)] int32
    backend.fill_bitmasks([state, None, ...], bitmask)    # may overlap the forward pass
    apply_bitmask_(logits, bitmask, [0])                  # radixflow.kernels.bitmask
    state.accept_token(token_id); state.is_terminated()

Validation (`validate_constraint`, the limits) is pure Python + interegular; the rest needs
torch and xgrammar and is imported on first use, so the HTTP process can validate cheaply.
`check_once` is validate_constraint with a thread-safe cache of verdicts (a repeat costs a
dict lookup); call it off the event loop: `await asyncio.to_thread(check_once, kind, spec)`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .limits import KINDS, GrammarLimits, check_once, validate_constraint
from .regex_check import RegexLimits
from .schema_check import SchemaLimits

if TYPE_CHECKING:
    from .backend import CompiledGrammar, GrammarBackend, build_tokenizer_info
    from .compile_cache import PendingGrammar, wait_any
    from .jump_forward import JumpForward
    from .state import GrammarState

_LAZY = {
    "CompiledGrammar": "backend", "GrammarBackend": "backend", "build_tokenizer_info": "backend",
    "PendingGrammar": "compile_cache", "wait_any": "compile_cache",
    "JumpForward": "jump_forward", "GrammarState": "state",
}

__all__ = [
    "KINDS",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarLimits",
    "GrammarState",
    "JumpForward",
    "PendingGrammar",
    "RegexLimits",
    "SchemaLimits",
    "build_tokenizer_info",
    "check_once",
    "validate_constraint",
    "wait_any",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
