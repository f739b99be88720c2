"""GrammarState: one request's position in its grammar (wraps an xgrammar GrammarMatcher)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import xgrammar as xgr

from .jump_forward import JumpForward, find_jump_forward
from .token_table import TokenTable, int32_bit

if TYPE_CHECKING:
    from .closing import BudgetCloser


class GrammarState:
    """Created by GrammarBackend.new_state. Not thread-safe: do not accept or roll back tokens
    while a bitmask fill for this state is running."""

    def __init__(self, matcher: xgr.GrammarMatcher, table: TokenTable):
        self.matcher = matcher
        self._table = table
        self.num_accepted = 0  # tokens accepted and not rolled back, EOS included
        # Budget-safe closing (closing.py): set by GrammarBackend.new_state(budget_safe=True);
        # None when off, or once the budget is known to be too small for any promise.
        self.closer: BudgetCloser | None = None

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""
        accepted = self.matcher.accept_token(token_id)
        if accepted:
            self.num_accepted += 1
        return accepted

    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token (EOS) has been accepted."""
        return self.matcher.is_terminated()

    def can_terminate(self) -> bool:
        """The text so far is a complete match: EOS is allowed now."""
        return self.matcher.is_terminated() or self.matcher.is_completed()

    def must_stop(self) -> bool:
        """Only a stop token is allowed next: the request may finish without another step."""
        if self.matcher.is_terminated():
            return True
        if not self.matcher.is_completed():
            return False
        bitmask = xgr.allocate_token_bitmask(1, self._table.vocab_size)  # [1, words]
        self.matcher.fill_next_token_bitmask(bitmask)
        for stop_id in self.matcher.stop_token_ids:
            bitmask[0, stop_id // 32] &= ~int32_bit(stop_id % 32)
        return not bool(bitmask.any())

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (an accepted EOS counts as one)."""
        if num_tokens <= 0:
            return
        if num_tokens > self.num_accepted:
            raise ValueError(f"cannot roll back {num_tokens} tokens; only {self.num_accepted} "
                             "were accepted")
        self.matcher.rollback(num_tokens)
        self.num_accepted -= num_tokens

    def fork(self) -> GrammarState:
        """An independent copy (for n > 1 samples sharing a prompt, or speculation)."""
        twin = GrammarState(self.matcher.fork(), self._table)
        twin.num_accepted = self.num_accepted
        twin.closer = copy.copy(self.closer)
        return twin

    def jump_forward(self, tokenizer: Any, output_ids: list[int], *,
                     max_new_tokens: int | None = None,
                     max_replaced: int | None = None) -> JumpForward | None:
        """The forced continuation after `output_ids` (the tokens this state accepted), or
        None. Does not change the state: apply it with `apply_jump_forward`. At most
        `max_replaced` trailing tokens are retokenized."""
        if self.matcher.is_terminated():
            return None
        return find_jump_forward(self.matcher, self._table, tokenizer, output_ids,
                                 max_new_tokens=max_new_tokens, max_replaced=max_replaced)

    def apply_jump_forward(self, jump: JumpForward) -> None:
        """Roll back the replaced tokens and accept the appended ones."""
        self.rollback(jump.num_replaced)
        for token_id in jump.token_ids:
            if not self.accept_token(token_id):
                raise RuntimeError(f"jump-forward token {token_id} rejected by the grammar")
