"""KV no query will read again: in a model whose every layer attends through a sliding window
of W tokens (Mistral 7B v0.1, Phi-3-mini-4k), a query at position p reads keys p - W + 1 .. p,
so once a request has computed `computed_len` tokens, the keys before computed_len - W are
dead to it. A long generation then holds about W slots, not its whole length.

Only the KV of generated tokens is freed, and only slots the request owns: its prompt stays
whole, so that the radix tree can still share it when the request ends (the system prompts
and chat histories other requests reuse), and the tree's own slots are never touched. A
request that freed some holds a gap [first, below) in its row (entries set to the padding
slot 0); at its end only the part before the gap (its prompt) goes to the radix tree, since a
tree path holds every token's KV from the root, and what follows the gap is freed. A request
retracted or failed after freeing is recomputed from what the tree holds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .grammar import HOLD_BACK_TOKENS

if TYPE_CHECKING:
    from .req import Req
    from .state import SchedulerState

FREE_AT_LEAST = 32  # slots per free: a step frees in batches, not one slot a token
# Tokens kept past the window: a jump-forward may take back the last few output tokens
# (grammar.HOLD_BACK_TOKENS), and the queries that replace them look further back.
TAKE_BACK_SLACK = 2 * HOLD_BACK_TOKENS


def window_of(model_args) -> int | None:
    """W when every layer attends through a window (the smallest, if they differ), else None."""
    layers = getattr(model_args, "num_layers", 0)
    windows = [model_args.layer_window(i) for i in range(layers)]
    if not windows or any(w is None for w in windows):
        return None
    return min(windows)


def free_behind_windows(state: SchedulerState, reqs: list[Req]) -> None:
    """Give the pool back each request's owned slots that no later query can attend to."""
    window = state.kv_window
    if window is None:
        return
    for req in reqs:
        if req.window_freed is None:
            start = max(req.tree_len, len(req.input_ids))
        else:
            start = req.window_freed[1]
        end = req.computed_len - window - TAKE_BACK_SLACK
        if end - start < FREE_AT_LEAST:
            continue
        row = state.req_to_token[req.req_pool_idx]
        state.kv_pool.free(row[start:end].long())
        row[start:end] = 0
        first = start if req.window_freed is None else req.window_freed[0]
        req.window_freed = (first, end)
