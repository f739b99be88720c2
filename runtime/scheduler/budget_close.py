"""Budget-safe closing, the scheduler's side (constrained/closing.py holds the search): before a
sampled token of a constrained request is appended, check that a completion of the output
still fits in the tokens left; when it would not, the completion and EOS are appended instead
(forced_tokens.py), unsampled. A jump-forward that would break the same promise is skipped.

The first states of a grammar are common to many requests: their witnesses (a shortest
completion) are shared, keyed by constraint and output bytes.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..constrained import JumpForward
    from ..constrained.closing import BudgetCloser
    from .grammar import SchedulerGrammar
    from .req import Req

logger = logging.getLogger(__name__)

# Completions of a grammar's first states (key: constraint and output bytes), shared by requests.
START_WITNESSES = 256
START_BYTES = 256


class BudgetClosing:
    def __init__(self, grammars: SchedulerGrammar):
        self.grammars = grammars  # its backend's token table, its stats, its stop ids
        self.stats = grammars.stats
        self._start_witnesses: OrderedDict[tuple, bytes] = OrderedDict()

    def budget_left(self, req: Req) -> int:
        """Tokens the request may still generate, EOS included."""
        left = req.num_tokens_left
        if self.grammars.context_len is not None:
            left = min(left, self.grammars.context_len - req.seq_len)
        return left

    def closing(self, req: Req, token: int) -> list[int] | None:
        """Before the sampled `token` is appended: None to keep it; else the tokens to append
        instead (a completion of the output, then EOS), already accepted by the grammar."""
        closer = self._ready_closer(req)
        if closer is None or token in self.grammars.stop_token_ids:
            return None
        start = time.perf_counter()
        try:
            return self._check(req, closer, token)
        finally:
            self.stats.budget_check_s += time.perf_counter() - start

    def keeps_jump(self, req: Req, jump: JumpForward) -> bool:
        """Whether the request's budget still fits a completion after `jump`."""
        closer = self._ready_closer(req)
        if closer is None:
            return True
        table = self.grammars.backend.table
        replaced = req.output_ids[len(req.output_ids) - jump.num_replaced:]
        grown = table.bytes_of(jump.token_ids)[len(table.bytes_of(replaced)):]
        left = self.budget_left(req) - (len(jump.token_ids) - jump.num_replaced)
        return closer.after_jump(grown, left)

    def _check(self, req: Req, closer: BudgetCloser, token: int) -> list[int] | None:
        matcher = req.grammar.matcher
        if not matcher.accept_token(token):
            return None  # not ours to report: accept() will
        searches = closer.num_searches
        try:
            keep = closer.keep(matcher, self.grammars.backend.table.token_bytes[token],
                               self.budget_left(req) - 1)
        finally:
            matcher.rollback(1)
        self.stats.num_budget_checks += 1
        self.stats.num_budget_searches += closer.num_searches - searches
        if keep:
            return None
        tokens = closer.closing_tokens(matcher)
        if tokens is None or len(tokens) + 1 > self.budget_left(req):
            # no tokenization of the completion, or it does not fit: no promise left to keep
            logger.warning("request %s: budget-safe closing impossible here", req.rid)
            req.grammar.closer = None
            return None
        tokens = [*tokens, self.grammars.stop_id]
        for t in tokens:
            if not req.grammar.accept_token(t):
                raise RuntimeError(f"closing token {t} rejected by the grammar")
        self.stats.num_closed_early += 1
        return tokens

    def _ready_closer(self, req: Req) -> BudgetCloser | None:
        """The request's closer, its promise checked: started on first use (from a shared
        witness for a grammar's first states); None, and dropped, if the budget cannot fit a
        completion."""
        closer = req.grammar.closer
        if closer is None:
            return None
        if closer.witness is not None:
            if closer.fits(self.budget_left(req)):
                return closer
            # The budget shrank while the grammar stood still (a reasoning model's thinking
            # spends it with the grammar dormant): start again from here.
            closer.witness = None
        start = time.perf_counter()
        key = None
        output = self.grammars.backend.table.bytes_of(req.output_ids)
        if len(output) <= START_BYTES:
            key = (req.sampling.constraint, output)
        searches = closer.num_searches
        if closer.start(req.grammar.matcher, self.budget_left(req),
                        self._start_witnesses.get(key) if key else None):
            if key is not None:
                self._start_witnesses[key] = closer.witness
                self._start_witnesses.move_to_end(key)
                if len(self._start_witnesses) > START_WITNESSES:
                    self._start_witnesses.popitem(last=False)
        else:
            req.grammar.closer = None
            self.stats.num_budget_unsafe += 1
        self.stats.num_budget_searches += closer.num_searches - searches
        self.stats.budget_check_s += time.perf_counter() - start
        return req.grammar.closer
