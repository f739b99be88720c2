"""After a forward pass: draw each request's token (`pick`), append it or close the request
early, check its stops, and finish it; then let the grammar append what it forces."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..messages import Finish
from ..sampling import SampleOutput, SamplingBatch, sample
from .stops import check_stops

if TYPE_CHECKING:
    from .failures import Failures
    from .forced_tokens import ForcedTokens
    from .grammar import MaskJob, SchedulerGrammar
    from .reasoning import SchedulerReasoning
    from .req import Req
    from .state import SchedulerState


class Commit:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar,
                 reasoning: SchedulerReasoning, forced: ForcedTokens, failures: Failures):
        self.state, self.grammars, self.reasoning = state, grammars, reasoning
        self.forced, self.failures = forced, failures
        self.stop_ids = sorted(state.eos_ids)
        # the draws of requests that carry no seed of their own (--seed)
        self.generator = torch.Generator(device=state.device).manual_seed(state.args.seed)

    def sample(self, reqs: list[Req], logits: torch.Tensor, mask: MaskJob | None) -> None:
        """Draw and commit one token per request (row i of `logits` is reqs[i]'s)."""
        bitmask, mask_rows = None, None
        if mask is not None:
            bitmask, mask_rows = self.grammars.wait(mask, logits.device), mask.rows
        self.commit(reqs, self.pick(reqs, logits, bitmask, mask_rows))

    def pick(self, reqs: list[Req], logits: torch.Tensor, bitmask: torch.Tensor | None,
             mask_rows: list[int] | None,
             output_ids: list[list[int]] | None = None) -> SampleOutput:
        """One token per row of `logits`, row i reqs[i]'s (grammar bitmask rows `mask_rows`);
        `output_ids`: each row's output before its token, where it is not its request's (a
        verify pass's rows after drafted tokens)."""
        batch = SamplingBatch.build(
            [r.sampling for r in reqs],
            output_ids if output_ids is not None else [r.output_ids for r in reqs],
            [r.input_ids for r in reqs], [r.generator for r in reqs], self.stop_ids,
            self.state.runner.vocab_size, logits.device)
        bitmask, mask_rows = self.reasoning.masks(reqs, bitmask, mask_rows, logits.device)
        top_k = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
        need_logprobs = any(r.return_logprob for r in reqs)
        return sample(logits, batch, bitmask=bitmask, mask_rows=mask_rows,
                      top_logprobs_num=top_k, need_logprobs=need_logprobs,
                      backend=self.state.args.sampling_backend, generator=self.generator)

    def commit(self, reqs: list[Req], result: SampleOutput) -> None:
        """Append each request's drawn token (or close it early), check stops, jump."""
        next_ids = result.next_ids.tolist()
        need_logprobs = any(r.return_logprob for r in reqs)
        logprobs = result.logprobs.tolist() if need_logprobs else [0.0] * len(reqs)
        tops = None
        if result.top_logprobs is not None:
            tops = [list(zip(v, i)) for v, i in
                    zip(result.top_logprobs[0].tolist(), result.top_logprobs[1].tolist())]
        for i, (req, token) in enumerate(zip(reqs, next_ids)):
            self.commit_token(req, token, logprobs[i], tops[i] if tops else None)

    def commit_token(self, req: Req, token: int, logprob: float,
                     top: list[tuple[float, int]] | None) -> None:
        """Append one drawn token (or close the request early), check stops, jump."""
        try:  # (a try costs nothing; a `with` per token would)
            closing = self.grammars.closing(req, token) if req.grammar is not None else None
            if closing is not None:  # the token would leave no completion within the budget
                self.forced.close_early(req, closing)
                return
            self._append(req, token, logprob, top[:req.top_logprobs_num] if top else None)
            if req.can_jump and req.finish is None:
                self.forced.jump_forward(req)
        except Exception as exc:
            self.failures.request_failed(req, exc)  # fails it alone (or re-raises)

    def _append(self, req: Req, token: int, logprob: float,
                top: list[tuple[float, int]] | None) -> None:
        state = self.state
        req.output_ids.append(token)
        state.stats["generation_tokens"] += 1
        if req.return_logprob:
            req.pending_logprobs.append(logprob)
            if req.top_logprobs_num:
                req.pending_top_logprobs.append(top or [])
        state.touched[req.rid] = req
        finish = self._check_finish(req, token)
        if finish is not None:
            state.finish(req, finish)

    def _check_finish(self, req: Req, token: int) -> Finish | None:
        thinking = self.reasoning.consumes(req, token)  # the grammar never sees the thinking
        if req.grammar is not None and not thinking:
            finish = self.grammars.accept(req, token)
            if finish is not None:
                return finish
        elif token in self.state.eos_ids and not req.sampling.ignore_eos:
            return Finish(type="stop", matched=token)
        return check_stops(req, token, self.state.context_len)
