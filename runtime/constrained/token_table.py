"""Per-tokenizer facts the grammar code needs: each token's bytes, which tokens are special,
and which are a strict prefix of a longer token (they may merge with what follows)."""

from __future__ import annotations

import functools

import xgrammar as xgr


class TokenTable:
    def __init__(self, tokenizer_info: xgr.TokenizerInfo):
        self._info = tokenizer_info
        self.vocab_size = tokenizer_info.vocab_size

    @functools.cached_property
    def token_bytes(self) -> list[bytes]:
        return list(self._info.decoded_vocab)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Tokens that are never text: special, stop and padding ids."""
        return frozenset(self._info.special_token_ids) | frozenset(self._info.stop_token_ids)

    @functools.cached_property
    def prefix_ids(self) -> frozenset[int]:
        """Ordinary tokens whose bytes begin some longer ordinary token."""
        special = self.special_ids
        prefixes: set[bytes] = set()
        for token_id, raw in enumerate(self.token_bytes):
            if token_id not in special:
                prefixes.update(raw[:i] for i in range(1, len(raw)))
        return frozenset(i for i, raw in enumerate(self.token_bytes)
                         if raw in prefixes and i not in special)

    @functools.cached_property
    def single_byte_ids(self) -> dict[int, int]:
        """byte value -> an ordinary token of exactly that byte (the lowest id)."""
        special = self.special_ids
        out: dict[int, int] = {}
        for token_id, raw in enumerate(self.token_bytes):
            if len(raw) == 1 and token_id not in special:
                out.setdefault(raw[0], token_id)
        return out

    def warm(self) -> None:
        """Compute the cached tables now (they are otherwise built on first use)."""
        _ = self.prefix_ids

    def bytes_of(self, token_ids: list[int]) -> bytes:
        table = self.token_bytes
        return b"".join(table[t] for t in token_ids)

    def is_text(self, token_ids: list[int]) -> bool:
        """True when every id is an ordinary in-range token."""
        special = self.special_ids
        return all(0 <= t < self.vocab_size and t not in special for t in token_ids)


def int32_bit(bit: int) -> int:
    """The int32 value with only `bit` (0..31) set, as xgrammar's bitmask words hold it."""
    return (1 << bit) - (1 << 32 if bit == 31 else 0)
