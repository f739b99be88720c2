"""Random walks through a grammar's token masks: a model-free check that every sequence the
masks allow decodes to valid output. Used by tests/runtime/constrained."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

_CLOSERS = b'"]}),;\n'


@dataclass
class Walk:
    output_ids: list[int] = field(default_factory=list)
    terminated: bool = False
    num_jumps: int = 0

    def text(self, backend) -> str:
        ids = [t for t in self.output_ids if t not in backend.stop_token_ids]
        return backend.table.bytes_of(ids).decode("utf-8")  # strict: masks keep UTF-8 whole


def allowed_ids(bitmask_row: torch.Tensor, vocab_size: int) -> list[int]:
    """Token ids whose bit is set in one int32 bitmask row."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask_row.unsqueeze(-1) >> shifts) & 1  # [words, 32]
    return bits.flatten()[:vocab_size].nonzero().flatten().tolist()


def random_walk(backend, state, seed: int, *, max_steps: int = 400, soft_budget: int = 48,
                tokenizer=None) -> Walk:
    """Sample uniformly among allowed tokens; past `soft_budget` steps steer toward an end.
    With `tokenizer`, take jump-forwards when the grammar forces text."""
    rng = random.Random(seed)
    walk = Walk()
    bitmask = backend.allocate_bitmask(1)
    stops = set(backend.stop_token_ids)
    table = backend.table
    for step in range(max_steps):
        if tokenizer is not None:
            jump = state.jump_forward(tokenizer, walk.output_ids)
            if jump is not None:
                before = table.bytes_of(walk.output_ids)
                state.apply_jump_forward(jump)
                walk.output_ids[len(walk.output_ids) - jump.num_replaced:] = jump.token_ids
                after = table.bytes_of(walk.output_ids)
                assert after.startswith(before) and len(after) > len(before), (before, after)
                assert after[len(before):].decode("utf-8") == jump.text
                walk.num_jumps += 1
        bitmask.fill_(-1)
        backend.fill_bitmasks([state], bitmask)
        allowed = allowed_ids(bitmask[0], backend.vocab_size)
        assert allowed, "the mask allows nothing"
        can_stop = [t for t in allowed if t in stops]
        text_ids = [t for t in allowed if t not in stops]
        late = step >= soft_budget
        if can_stop and (not text_ids or late or rng.random() < 0.1):
            assert state.accept_token(can_stop[0])
            walk.output_ids.append(can_stop[0])
            break
        if late:
            recent = table.bytes_of(walk.output_ids[-16:])[-16:]
            text_ids = _steer(state, table, text_ids, recent, rng)
        token = rng.choice(text_ids)
        assert state.accept_token(token), f"masked-in token {token} was rejected"
        walk.output_ids.append(token)
    walk.terminated = state.is_terminated()
    return walk


def _steer(state, table, text_ids: list[int], recent: bytes, rng: random.Random) -> list[int]:
    """Prefer tokens that complete the grammar, then ones bringing punctuation not seen in the
    last few bytes (the way out of a loop is usually a new delimiter: '@', '"', '.'), then
    ones that close a string or a bracket."""
    sample = rng.sample(text_ids, min(len(text_ids), 48))
    finishing = []
    for token in sample:
        if state.accept_token(token):
            if state.can_terminate():
                finishing.append(token)
            state.rollback(1)
    if finishing:
        return finishing
    novel = [t for t in text_ids if any(not chr(c).isalnum() and c < 128 and c not in recent
                                        for c in table.token_bytes[t])]
    if novel:
        return novel
    closing = [t for t in text_ids if any(c in _CLOSERS for c in table.token_bytes[t])]
    return closing or text_ids
