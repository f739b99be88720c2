"""Structured generation: regex, JSON Schema, EBNF and choices constraints over xgrammar.

    backend = GrammarBackend(tokenizer, vocab_size)      # one per tokenizer
    state = backend.new_state(backend.compile("regex", r"\\d{4}-\\d{2}-\\d{2}"))
    bitmask = backend.allocate_bitmask(bs)                # [bs, ceil(vocab / 32)] int32
    backend.fill_bitmasks([state, None, ...], bitmask)    # may overlap the forward pass
    backend.apply_bitmask(logits, bitmask, rows=[0])      # in place, -inf where disallowed
    state.accept_token(token_id); state.is_terminated()
"""

from __future__ import annotations

from .backend import CompiledGrammar, GrammarBackend, build_tokenizer_info
from .compile_cache import PendingGrammar
from .jump_forward import JumpForward
from .limits import KINDS, GrammarLimits, validate_constraint
from .regex_check import RegexLimits
from .schema_check import SchemaLimits
from .state import GrammarState

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
    "validate_constraint",
]
