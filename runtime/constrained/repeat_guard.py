"""max_repeat_run: a cheap guard against the loops small models fall into inside constrained
strings and numbers ("1111111...", "aaaa...", one token over and over).

With a limit N, the mask of a constrained request also leaves out every token that would make
the output hold a run of more than N copies of one character, and the token that was already
sampled N times in a row. Brackets ({ } [ ] ( )) are exempt, so nesting stays free. When the
grammar allows nothing else (a literal the schema fixes), the guard steps aside for that step.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .token_table import TokenTable

EXEMPT = frozenset(b"{}[]()")
MAX_LIMIT = 64  # longest max_repeat_run accepted (runs are counted over this many bytes)


class RepeatGuard:
    """Per tokenizer: which tokens each (character, run so far, limit) bans."""

    def __init__(self, table: TokenTable):
        self.table = table
        self.num_words = (table.vocab_size + 31) // 32

    @functools.cached_property
    def _runs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per token: its first byte (-1: none or exempt), how many times that byte opens it,
        and its longest run of one non-exempt byte."""
        size = self.table.vocab_size
        first, lead, longest = (np.full(size, -1, np.int16), np.zeros(size, np.int16),
                                np.zeros(size, np.int16))
        special = self.table.special_ids
        for token_id, raw in enumerate(self.table.token_bytes[:size]):
            if not raw or token_id in special:
                continue
            runs = _runs_of(raw)
            if raw[0] not in EXEMPT:
                first[token_id], lead[token_id] = raw[0], runs[0][1]
            longest[token_id] = max((n for b, n in runs if b not in EXEMPT), default=0)
        return first, lead, longest

    def banned(self, output_ids: list[int], limit: int) -> torch.Tensor | None:
        """int32 bitmask words of the tokens banned after `output_ids`, or None if none are."""
        tail = self.table.bytes_of(output_ids[-MAX_LIMIT:])[-MAX_LIMIT:]
        char, run = (tail[-1], len(tail) - len(tail.rstrip(tail[-1:]))) if tail else (-1, 0)
        if char in EXEMPT:
            char, run = -1, 0
        repeated = -1
        if len(output_ids) >= limit and len(set(output_ids[-limit:])) == 1:
            repeated = output_ids[-1]
        return self._mask(limit, char, run, repeated)

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one guard per backend, kept for its life)
    def _mask(self, limit: int, char: int, run: int, repeated: int) -> torch.Tensor | None:
        first, lead, longest = self._runs
        ban = longest > limit
        if char >= 0:
            ban |= (first == char) & (lead > limit - run)
        if 0 <= repeated < len(ban):
            ban[repeated] = True
        if not ban.any():
            return None
        return _pack(ban, self.num_words)


def apply_bans(bitmask: torch.Tensor, bans: list[tuple[int, torch.Tensor]]) -> None:
    """Clear each (row, banned words) from the filled bitmask, unless that leaves the row
    empty (the grammar forces the repeat)."""
    for row, ban in bans:
        allowed = bitmask[row] & ~ban
        if bool(allowed.any()):
            bitmask[row].copy_(allowed)


def _runs_of(raw: bytes) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for b in raw:
        if runs and runs[-1][0] == b:
            runs[-1] = (b, runs[-1][1] + 1)
        else:
            runs.append((b, 1))
    return runs


def _pack(flags: np.ndarray, num_words: int) -> torch.Tensor:
    """bool per token -> int32 words, bit (id % 32) of word id // 32 (xgrammar's layout)."""
    padded = np.zeros(num_words * 32, dtype=bool)
    padded[:len(flags)] = flags
    packed = np.packbits(padded, bitorder="little").view("<i4")
    return torch.from_numpy(packed.copy())
