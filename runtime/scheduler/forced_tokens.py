"""Tokens nobody sampled: jump-forward appends what the grammar forces, budget-safe closing
appends a completion and EOS, and a jump may first take back unsent tokens (rollback).

grammar.py says why a request that can jump holds output back, and how a closing is decided;
this module applies them to the request: its output, its KV, its stop checker, its finish.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from ..messages import Finish
from .stops import check_stops, new_stop_checker

if TYPE_CHECKING:
    from .grammar import SchedulerGrammar
    from .req import Req
    from .state import SchedulerState


class ForcedTokens:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar):
        self.state, self.grammars = state, grammars

    def jump_forward(self, req: Req) -> None:
        """Append the tokens the grammar forces, unsampled; end with EOS if nothing else may
        follow. The next decode pass computes the forced tokens along with everyone's."""
        state = self.state
        jump = self.grammars.find_jump(req, max_replaced=num_replaceable(req))
        if jump is not None:
            state.touched[req.rid] = req
            self.drop_output(req, jump.num_replaced)
            for token in jump.token_ids:
                req.output_ids.append(token)
                state.stats["generation_tokens"] += 1
                finish = check_stops(req, token, state.context_len)
                if finish is not None:
                    state.finish(req, finish)
                    return
        stop_id = self.grammars.forced_stop(req)
        if stop_id is not None:  # the EOS a sampler would have been forced to pick
            req.output_ids.append(stop_id)
            state.stats["generation_tokens"] += 1
            state.finish(req, Finish(type="stop", matched=stop_id))

    def close_early(self, req: Req, tokens: list[int]) -> None:
        """Budget-safe closing: append the completion and EOS unsampled (their logprobs are
        NaN: nothing scored them) and finish, closed_early."""
        state = self.state
        state.touched[req.rid] = req
        state.kv.drop_uncomputed(req)  # (overlap: the pass in flight computed the dropped token)
        for k, token in enumerate(tokens):
            req.output_ids.append(token)
            state.stats["generation_tokens"] += 1
            if req.return_logprob:
                req.pending_logprobs.append(math.nan)
                if req.top_logprobs_num:
                    req.pending_top_logprobs.append([])
            last = k == len(tokens) - 1
            finish = (Finish(type="stop", matched=token) if last
                      else check_stops(req, token, state.context_len))
            if finish is not None:
                state.finish(req, msgspec.structs.replace(finish, closed_early=True))
                return

    def drop_output(self, req: Req, num_tokens: int) -> None:
        """Forget the last `num_tokens` output tokens, freeing the KV computed for them."""
        if num_tokens <= 0:
            return
        del req.output_ids[-num_tokens:]
        self.state.stats["generation_tokens"] -= num_tokens
        self.state.kv.drop_uncomputed(req)
        if req.stop_checker is not None:  # it cannot take tokens back: rebuild it
            req.stop_checker = new_stop_checker(self.state.tokenizer, req)
            req.stop_checker.append(req.output_ids)


def num_replaceable(req: Req) -> int:
    """Trailing output tokens a jump may rewrite: not streamed yet, slots not the tree's."""
    in_tree = max(0, req.tree_len - len(req.input_ids))
    answer_start = req.thinking.answer_start if req.thinking is not None else 0
    return len(req.output_ids) - max(req.sent_len, in_tree, answer_start)
