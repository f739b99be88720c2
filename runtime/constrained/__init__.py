"""Structured generation: regex, JSON Schema, EBNF, choices and structural-tag constraints
over xgrammar.

    constraint = prepare("regex", r"\\d{4}-\\d{2}-\\d{2}")   # the front door: checked once
    backend = GrammarBackend(tokenizer, vocab_size)      # one per tokenizer
    state = backend.new_state(backend.submit_prepared(constraint).result())
    bitmask = backend.allocate_bitmask(bs)                # [bs, ceil(vocab / 32)] int32
    backend.fill_bitmasks([state, None, ...], bitmask)    # may overlap the forward pass
    apply_bitmask_(logits, bitmask, [0])                  # radixflow.kernels.bitmask
    state.accept_token(token_id); state.is_terminated()

`prepare` (front_door.py) is pure Python + interegular, so the HTTP process prepares every
constraint; the scheduler compiles the Constraint it is sent without checking it again. What
radixflow does because of xgrammar's own gaps is in xgrammar_compat/, with the version it was
measured against. Everything is imported on first use: importing `Constraint` or the limits
loads neither xgrammar nor torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .constraint import Constraint
from .limits import KINDS, GrammarLimits, RegexLimits, SchemaLimits

if TYPE_CHECKING:
    from .backend import CompiledGrammar, GrammarBackend, build_tokenizer_info
    from .compile_cache import PendingGrammar, wait_any
    from .front_door import clear_prepared, prepare, validate_constraint
    from .jump_forward import JumpForward
    from .state import GrammarState

_LAZY = {
    "CompiledGrammar": "backend", "GrammarBackend": "backend", "build_tokenizer_info": "backend",
    "PendingGrammar": "compile_cache", "wait_any": "compile_cache",
    "clear_prepared": "front_door", "prepare": "front_door",
    "validate_constraint": "front_door",
    "JumpForward": "jump_forward", "GrammarState": "state",
}

__all__ = [
    "KINDS",
    "CompiledGrammar",
    "Constraint",
    "GrammarBackend",
    "GrammarLimits",
    "GrammarState",
    "JumpForward",
    "PendingGrammar",
    "RegexLimits",
    "SchemaLimits",
    "build_tokenizer_info",
    "clear_prepared",
    "prepare",
    "validate_constraint",
    "wait_any",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
