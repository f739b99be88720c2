"""The scheduler's grammar work: constraints compile in the background, the bitmask of a step is
filled on a CPU thread while the model computes, sampled tokens advance the grammar, and
jump-forward finds the tokens it forces (forced_tokens.py appends them).

Jump-forward and streaming. A jump may retokenize the last few output tokens (`num_replaced`):
their bytes are a prefix of the new tokens' bytes, so the text only grows, but the token ids
change, and outputs leave the scheduler as token-id deltas. So a request that can jump holds
its last HOLD_BACK_TOKENS tokens back from the stream until it finishes, and a jump replaces
only tokens not sent yet (and not in the radix tree). Downstream detokenizers never see a
token taken back. Requests that report logprobs never jump: a token that was not sampled has
no logprob. The next decode pass computes forced tokens, one query row each, with everyone
else's tokens (decode.py), so a jump costs no forward pass of its own.

Budget-safe closing (constrained/closing.py, budget_close.py). A request's GrammarState
carries a BudgetCloser unless the request or the server turned it off. Each sampled token is
checked before the scheduler appends it (`closing`): if keeping it would leave no completion
that fits in the tokens left, the token is dropped and the closer's completion plus EOS are
appended instead, unsampled, and the request ends ("stop", closed_early). A jump-forward that
would break the same promise is skipped (the model writes the forced text itself, checked
token by token).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import Fatal, GrammarError
from ..messages import Finish
from .budget_close import BudgetClosing

if TYPE_CHECKING:
    from ..constrained import GrammarBackend, JumpForward
    from .req import Req

logger = logging.getLogger(__name__)

# How long a step with nothing else to do waits for a compile before returning.
COMPILE_POLL_S = 0.01
# Output tokens a jumping request keeps out of the stream, so that a jump can retokenize
# them: jump_forward.BOUNDARY_TOKENS, the window it re-reads (a jump never replaces more
# than the unsent tokens, so a smaller value only means fewer boundary merges).
HOLD_BACK_TOKENS = 4


@dataclass
class GrammarStats:
    """Cumulative counters, for benchmarks and tests."""

    num_masked_rows: int = 0  # sampled tokens whose logits a grammar masked
    mask_fill_s: float = 0.0  # bitmask filling, on a CPU thread beside the forward
    mask_wait_s: float = 0.0  # time sampling waited for a fill: the part on the critical path
    num_jumps: int = 0
    num_forced_tokens: int = 0  # tokens appended by jump-forward, without sampling
    num_replaced_tokens: int = 0  # trailing tokens retokenized by a jump
    num_forced_stops: int = 0  # requests ended with EOS without sampling it
    # Budget-safe closing
    num_budget_checks: int = 0  # sampled tokens checked against the budget
    num_budget_searches: int = 0  # shortest-completion searches (the costly path)
    num_closed_early: int = 0  # requests ended by their closing completion
    num_budget_unsafe: int = 0  # requests whose first completion did not fit their budget
    num_jumps_deferred: int = 0  # jump-forwards skipped: their tokens would break the budget
    budget_check_s: float = 0.0  # time in checks and closings, on the scheduler's path


@dataclass
class MaskJob:
    """A bitmask being filled for one batch."""

    bitmask: torch.Tensor  # [bs, ceil(vocab / 32)] int32, on CPU
    rows: list[int]  # batch rows with a grammar
    future: Future
    started: float = field(default_factory=time.perf_counter)
    finished: float = 0.0


class SchedulerGrammar:
    """Everything the scheduler asks of runtime/constrained, for all requests of one model."""

    def __init__(self, tokenizer: Any, vocab_size: int, *, stop_token_ids: list[int],
                 compile_timeout: float, jump_forward: bool, budget_safe: bool = True,
                 context_len: int | None = None, compile_threads: int = 2):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.compile_timeout = compile_timeout
        self.compile_threads = compile_threads  # --grammar-compile-threads
        self.jump_forward = jump_forward
        self.budget_safe = budget_safe  # the server's switch; requests have their own
        self.context_len = context_len
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_id = eos if eos in stop_token_ids else min(stop_token_ids)
        self.stats = GrammarStats()
        self.budget = BudgetClosing(self)
        self._backend: Future | None = None

    def prebuild(self) -> None:
        """Build the backend (the tokenizer's tables for xgrammar, then the token table: long
        for a large vocabulary) on a thread now, not on the first constrained request's step,
        where every running stream would wait for it."""
        if self._backend is None:
            self._backend = Future()
            threading.Thread(target=self._build, name="grammar-backend", daemon=True).start()

    def _build(self) -> None:
        from ..constrained import GrammarBackend

        try:
            self._backend.set_result(GrammarBackend(
                self.tokenizer, self.vocab_size, compile_timeout=self.compile_timeout,
                compile_threads=self.compile_threads, stop_token_ids=self.stop_token_ids))
        except BaseException as exc:  # raised where the backend is asked for
            self._backend.set_exception(exc)

    @property
    def backend(self) -> GrammarBackend:
        """The backend, built on first use unless prebuild() started it."""
        if self._backend is None:
            self._backend = Future()
            self._build()
        return self._backend.result()

    @property
    def built_backend(self) -> GrammarBackend | None:
        """The backend if it is built, else None (a view must not start the build)."""
        built = self._backend is not None and self._backend.done()
        return self._backend.result() if built and not self._backend.exception() else None

    # ---- compiling ----

    def submit(self, req: Req) -> Finish | None:
        """Start compiling the request's constraint, as the front door prepared it (one
        built by hand is prepared on the compile thread, not here); an abort (503) if compiles
        past their deadline fill their cap."""
        try:
            req.pending_grammar = (self.backend.submit_prepared(req.constraint)
                                   if req.constraint is not None
                                   else self.backend.submit(*req.sampling.constraint))
        except GrammarError as exc:
            return rejected(exc)
        req.can_jump = self.jump_forward and not req.return_logprob
        return None

    def resolve(self, waiting: list[Req], *,
                block: bool) -> tuple[list[Req], list[tuple[Req, Finish]]]:
        """Give finished compiles their GrammarState: (requests now ready, (request, abort)
        for failed compiles). With `block`, first wait a little for a compile (the step has
        nothing else to do)."""
        pending = [r for r in waiting if r.pending_grammar is not None]
        if not pending:
            return [], []
        if block:
            from ..constrained import wait_any

            wait_any([r.pending_grammar for r in pending], COMPILE_POLL_S)
        ready, failed = [], []
        for req in pending:
            if not req.pending_grammar.done():
                continue
            try:
                req.grammar = self.backend.new_state(
                    req.pending_grammar.result(),
                    budget_safe=self.budget_safe and req.sampling.budget_safe)
                ready.append(req)
            except GrammarError as exc:
                failed.append((req, rejected(exc)))
            except Fatal:
                raise
            except Exception as exc:  # the compile crashed: it fails this request alone
                logger.error("request %s: its constraint failed to compile: %s: %s", req.rid,
                             type(exc).__name__, exc, exc_info=exc)
                failed.append((req, internal_error(exc)))
            req.pending_grammar = None
        return ready, failed

    # ---- bitmasks ----

    def start_fill(self, reqs: list[Req]) -> MaskJob | None:
        """Fill the batch's bitmask on a CPU thread; None (no work) if no row has a grammar.
        The requests' grammars must not change until `wait` has waited for it."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None
        bitmask = self.backend.allocate_bitmask(len(reqs))  # all allowed
        bans = self._repeat_bans(reqs, rows)
        after = None
        if bans:
            from ..constrained.repeat_guard import apply_bans

            def after() -> None:
                apply_bans(bitmask, bans)
        future = self.backend.fill_bitmasks_async([r.grammar for r in reqs], bitmask, after)
        job = MaskJob(bitmask, rows, future)
        future.add_done_callback(lambda _: setattr(job, "finished", time.perf_counter()))
        return job

    def _repeat_bans(self, reqs: list[Req], rows: list[int]) -> list[tuple[int, torch.Tensor]]:
        """(row, tokens banned) for the rows with max_repeat_run (repeat_guard.py)."""
        bans = []
        for row in rows:
            req = reqs[row]
            limit = req.sampling.max_repeat_run
            if limit and not req.grammar.is_terminated():
                ban = self.backend.repeat_guard.banned(req.output_ids, limit)
                if ban is not None:
                    bans.append((row, ban))
        return bans

    def wait(self, job: MaskJob, device: torch.device) -> torch.Tensor:
        """Wait for the fill; the bitmask on `device`, for the sampler to apply to job.rows."""
        start = time.perf_counter()
        job.future.result()
        self.stats.mask_wait_s += time.perf_counter() - start
        self.stats.mask_fill_s += max(job.finished, start) - job.started
        self.stats.num_masked_rows += len(job.rows)
        return job.bitmask.to(device, non_blocking=True)

    # ---- tokens ----

    def accept(self, req: Req, token: int) -> Finish | None:
        """Advance the request's grammar by a sampled token; a Finish if it ends here."""
        if not req.grammar.accept_token(token):
            # The mask allowed only grammar tokens, so this is our bug (or a banned EOS).
            logger.error("request %s: the grammar rejected sampled token %d; aborting it",
                         req.rid, token)
            return Finish(type="abort", status_code=500,
                          message=f"internal error: the grammar rejected token {token}")
        if req.grammar.is_terminated():
            return Finish(type="stop", matched=token)
        return None

    def find_jump(self, req: Req, max_replaced: int) -> JumpForward | None:
        """The forced continuation of the request's output, already applied to its grammar
        (the caller applies it to the output), or None."""
        jump = req.grammar.jump_forward(self.tokenizer, req.output_ids,
                                        max_new_tokens=req.num_tokens_left,
                                        max_replaced=max_replaced)
        if jump is None:
            return None
        if not self.budget.keeps_jump(req, jump):
            self.stats.num_jumps_deferred += 1
            return None
        req.grammar.apply_jump_forward(jump)
        self.stats.num_jumps += 1
        self.stats.num_forced_tokens += len(jump.token_ids)
        self.stats.num_replaced_tokens += jump.num_replaced
        return jump

    def forced_stop(self, req: Req) -> int | None:
        """The EOS id to end the request with, if its grammar allows nothing else."""
        if not req.grammar.must_stop():
            return None
        self.stats.num_forced_stops += 1
        return self.stop_id

    # ---- budget-safe closing (budget_close.py) ----

    def closing(self, req: Req, token: int) -> list[int] | None:
        """Before the sampled `token` is appended: None to keep it; else the tokens to append
        instead (a completion of the output, then EOS), already accepted by the grammar."""
        return self.budget.closing(req, token)

    def wait_fills(self) -> None:
        """Let the bitmask fills still running on the grammar thread finish (they read the
        requests' grammars)."""
        if self._backend is not None and self._backend.done() \
                and self._backend.exception() is None:
            self._backend.result().wait_fills()

    def shutdown(self) -> None:
        if self._backend is not None and self._backend.done() \
                and self._backend.exception() is None:
            self._backend.result().shutdown()


def rejected(exc: GrammarError) -> Finish:
    return Finish(type="abort", message=str(exc), status_code=exc.status_code)


def internal_error(exc: BaseException) -> Finish:
    """The finish of a request that failed inside the server (a 500 naming the error)."""
    return Finish(type="abort", status_code=500,
                  message=f"internal error: {type(exc).__name__}: {exc}")
