"""Jump-forward: when the grammar forces a unique continuation, append its tokens without
sampling, retokenizing the boundary so the sequence reads as the tokenizer would write it.

    output_ids:  ... 'Bob'  '"'            forced text: ', "age": '
    retokenized: ... 'Bob'  '",'  ' "'  'age'  '":'      (' ' left for the model)
    -> JumpForward(num_replaced=1, token_ids=['",', ' "', 'age', '":'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import xgrammar as xgr

from .token_table import TokenTable

# Output tokens re-read at the boundary; enough for the merges a forced text can cause.
BOUNDARY_TOKENS = 4


@dataclass(frozen=True)
class JumpForward:
    """Drop the last `num_replaced` output tokens (their KV must be recomputed), then append
    `token_ids` without sampling. The bytes dropped are a prefix of the bytes appended, so the
    output text only grows, by `text` (the forced continuation)."""

    num_replaced: int
    token_ids: list[int]
    text: str


def find_jump_forward(matcher: xgr.GrammarMatcher, table: TokenTable, tokenizer: Any,
                      output_ids: list[int], *, max_new_tokens: int | None = None,
                      max_replaced: int | None = None) -> JumpForward | None:
    """The jump for `matcher` (which has accepted exactly `output_ids`), or None.

    max_new_tokens caps how much the output may grow (len after - len before); max_replaced
    caps num_replaced (e.g. to tokens not yet streamed); the matcher is not changed.
    """
    forced = matcher.find_jump_forward_string()
    if not forced:
        return None
    for window in _windows(table, output_ids, max_replaced):
        jump = _retokenized(matcher, table, tokenizer, output_ids, window, forced, max_new_tokens)
        if jump is not None:
            return jump
    tokens = matcher.find_jump_forward_tokens()  # xgrammar's greedy tokenization, no boundary
    if max_new_tokens is not None:
        tokens = tokens[:max(0, max_new_tokens)]
    if not tokens:
        return None
    return JumpForward(0, tokens, table.bytes_of(tokens).decode("utf-8", errors="replace"))


def _windows(table: TokenTable, output_ids: list[int], max_replaced: int | None) -> list[int]:
    """Candidate numbers of trailing tokens to re-read: the boundary window, widened until its
    bytes are whole UTF-8 (at most max_replaced), then none at all."""
    limit = len(output_ids) if max_replaced is None else min(len(output_ids), max_replaced)
    candidates = []
    for window in range(min(BOUNDARY_TOKENS, max(limit, 0)), limit + 1):
        tail = output_ids[len(output_ids) - window:]
        if not table.is_text(tail):
            break
        try:
            table.bytes_of(tail).decode("utf-8")
        except UnicodeDecodeError:
            if window >= BOUNDARY_TOKENS + 4:
                break
            continue
        candidates.append(window)
        break
    candidates.append(0)
    return candidates


def _retokenized(matcher: xgr.GrammarMatcher, table: TokenTable, tokenizer: Any,
                 output_ids: list[int], window: int, forced: str,
                 max_new_tokens: int | None) -> JumpForward | None:
    tail = output_ids[len(output_ids) - window:] if window else []
    tail_bytes = table.bytes_of(tail)
    new_ids = tokenizer.encode(tail_bytes.decode("utf-8") + forced, add_special_tokens=False)
    # NOTE: tokenizers may normalise text (prefix spaces, unicode forms); only an exact byte
    # round trip keeps the output unchanged.
    if not table.is_text(new_ids) or table.bytes_of(new_ids) != tail_bytes + forced.encode():
        return None
    kept = 0
    while kept < min(len(tail), len(new_ids)) and tail[kept] == new_ids[kept]:
        kept += 1
    num_replaced = len(tail) - kept
    append = new_ids[kept:]
    if append and append[-1] in table.prefix_ids:
        append = append[:-1]  # it could merge with the next sampled text: let the model write it
    if max_new_tokens is not None:
        append = append[:max(0, num_replaced + max_new_tokens)]
    replaced_bytes = table.bytes_of(tail[kept:])
    append_bytes = table.bytes_of(append)
    if len(append_bytes) <= len(replaced_bytes) or not append_bytes.startswith(replaced_bytes):
        return None
    probe = matcher.fork()
    if num_replaced:
        probe.rollback(num_replaced)
    if not all(probe.accept_token(t) for t in append):
        return None
    return JumpForward(num_replaced, append,
                       append_bytes[len(replaced_bytes):].decode("utf-8", errors="replace"))
