"""What the scheduler does when something fails: one request's failure fails that request, the
scheduler keeps serving the others; only a broken invariant stops it.

- A request's own failure (its constraint's compile or matcher, its stop strings, anything
  raised while its message is taken in or its sampled token is committed): the request ends
  with an abort, status 500 ("internal error: ..."), its KV goes back like any finished
  request's, and the step goes on with the others (`isolate`, `request_failed`,
  `add_request`).
- A forward pass that raises (MemoryError, a torch out-of-memory, ...): it runs again in
  halves, by request, until the parts pass (`forward_in_parts`). A request that fails alone
  ends with an abort; the others of that batch are retracted (their KV beyond what the radix
  tree holds is not trusted) and recompute when readmitted.
- Anything else a step raises that no request can be blamed for: every request holding KV
  ends with an abort (500), the waiting ones stay queued, and the step after goes on.
- After any of these the KV slots that no longer belong to anyone are freed (a sweep) and the
  slot invariant is checked. A broken invariant raises InvariantBroken, which (like every
  `errors.Fatal`: a lost tensor-parallel rank too) is never caught here: the scheduler
  process logs it and exits non-zero (process.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from ..errors import Fatal, InvariantBroken
from ..messages import GenerateReq
from .decode import retract
from .grammar import internal_error
from .kv_cache import cat_slots
from .req import Req, ReqStatus

if TYPE_CHECKING:
    from ..forward_batch import BatchRequest
    from .grammar import SchedulerGrammar
    from .state import SchedulerState

logger = logging.getLogger(__name__)


class ForwardFailed(Exception):
    """A forward pass that failed even in parts: the requests (rows of req_to_token) of the
    whole batch, and those that failed alone."""

    def __init__(self, batch: set[int], culprits: set[int], cause: BaseException):
        super().__init__(f"{len(culprits)} of {len(batch)} requests failed their forward pass: "
                         f"{type(cause).__name__}: {cause}")
        self.batch, self.culprits, self.cause = batch, culprits, cause


def forward_in_parts(forward: Callable, mode, parts: list[BatchRequest],
                     slots: torch.Tensor) -> torch.Tensor:
    """forward(mode, parts, slots), run again in halves (a request's parts kept together)
    where it raises; ForwardFailed names the requests that fail alone."""
    try:
        return forward(mode, parts, slots)
    except Fatal:
        raise
    except Exception as exc:
        cause = exc
    logger.warning("a forward pass of %d requests failed (%s: %s); running it in parts",
                   len({p.req_pool_idx for p in parts}), type(cause).__name__, cause)
    groups: list[tuple[list, torch.Tensor]] = []
    used = 0
    for part in parts:
        n = len(part.ids)
        if groups and groups[-1][0][-1].req_pool_idx == part.req_pool_idx:
            groups[-1] = (groups[-1][0] + [part], torch.cat([groups[-1][1],
                                                             slots[used:used + n]]))
        else:
            groups.append(([part], slots[used:used + n]))
        used += n
    culprits: set[int] = set()
    outs: list[torch.Tensor] = []
    _run_halves(forward, mode, groups, culprits, outs, failed=True)
    if culprits:
        raise ForwardFailed({p.req_pool_idx for p in parts}, culprits, cause)
    rows = [o for o in outs if o.shape[0]]
    return torch.cat(rows) if rows else outs[0]


def _run_halves(forward, mode, groups, culprits: set[int], outs: list, *, failed: bool) -> None:
    """Run `groups` as one pass (unless it just failed); where that fails, each half."""
    if not failed:
        parts = [p for g, _ in groups for p in g]
        try:
            outs.append(forward(mode, parts, torch.cat([s for _, s in groups])))
            return
        except Fatal:
            raise
        except Exception as exc:
            logger.warning("a part of %d requests failed: %s: %s", len(groups),
                           type(exc).__name__, exc)
    _release_cached_memory()
    if len(groups) == 1:
        culprits.add(groups[0][0][0].req_pool_idx)
        return
    half = len(groups) // 2
    _run_halves(forward, mode, groups[:half], culprits, outs, failed=False)
    _run_halves(forward, mode, groups[half:], culprits, outs, failed=False)


def _release_cached_memory() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class Failures:
    """The scheduler's failure handling (see the module's docstring)."""

    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar):
        self.state, self.grammars = state, grammars
        self.num_failed_requests = 0
        self.num_recoveries = 0

    # ---- one request ----

    @contextlib.contextmanager
    def isolate(self, req: Req) -> Iterator[None]:
        """Whatever the block raises fails `req` alone (an errors.Fatal still stops)."""
        try:
            yield
        except Fatal:
            raise
        except Exception as exc:
            self.fail(req, exc)

    def request_failed(self, req: Req, exc: Exception) -> None:
        """`isolate`'s except clause, for loops that cannot afford a `with` per request."""
        if isinstance(exc, Fatal):
            raise exc
        self.fail(req, exc)

    def fail(self, req: Req, exc: BaseException) -> None:
        logger.error("request %s failed: %s: %s", req.rid, type(exc).__name__, exc,
                     exc_info=exc)
        self.num_failed_requests += 1
        if req.finish is None:
            self.state.kv.drop_uncomputed(req)
            self.state.finish(req, internal_error(exc))

    def add_request(self, msg: GenerateReq, add: Callable[[GenerateReq], None]) -> None:
        """add(msg) (intake.py); what it raises fails that request alone."""
        try:
            add(msg)
        except Fatal:
            raise
        except Exception as exc:
            req = self.state.by_rid.get(msg.rid)
            if req is None or req.arrival != self.state.num_arrivals:  # not in yet
                req = Req(rid=msg.rid, input_ids=list(msg.input_ids), sampling=msg.sampling)
            self.fail(req, exc)

    # ---- a whole step ----

    def guard(self, fn: Callable[[], None]) -> None:
        """Run a step's work; recover from what it raises (but a broken invariant)."""
        try:
            fn()
        except Fatal:
            raise
        except Exception as exc:
            try:
                self.recover(exc)
            except Fatal:
                raise
            except Exception as again:
                raise InvariantBroken(f"the scheduler could not recover from "
                                      f"{type(exc).__name__}: {exc}: {type(again).__name__}: "
                                      f"{again}") from again

    def recover(self, exc: BaseException) -> None:
        """Bring every request back to a state the next step can go on from."""
        state = self.state
        self.num_recoveries += 1
        logger.error("a scheduler step failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
        self.grammars.wait_fills()  # a fill still running reads the grammars changed below
        untrusted: set[int] = set()  # rows whose KV beyond the tree's part may be unwritten
        in_flight, state.in_flight = state.in_flight, None
        if in_flight is not None:
            try:
                in_flight.logits.result()
            except Exception as lost:
                if isinstance(lost, ForwardFailed):
                    exc = lost
                untrusted |= {r.req_pool_idx for r in in_flight.reqs if r.req_pool_idx is not None}
        live = state.prefilling + state.running
        if isinstance(exc, ForwardFailed):
            untrusted |= exc.batch
            culprits = [r for r in live if r.req_pool_idx in exc.culprits]
            cause: BaseException = exc.cause
        else:  # nothing to blame: every request whose state the step was changing
            culprits, cause = list(live), exc
        for req in live:
            if req.req_pool_idx in untrusted:
                req.computed_len = req.tree_len  # the rest is swept below
                req.window_freed = None  # (its gap, past tree_len, is recomputed)
            state.kv.drop_uncomputed(req)
        for req in culprits:
            self.fail(req, cause)
        for req in list(state.running):
            if req.req_pool_idx in untrusted or req.computed_len >= req.seq_len:
                retract(state, req)  # recomputes from the tree (or lost its sampled token)
        freed = self.sweep()
        if freed:
            logger.warning("freed %d KV slots no request held after the failure", freed)
        state.check_slots()

    def sweep(self) -> int:
        """Free the KV slots and request rows nobody holds (left by a step that failed half
        way); the number of slots freed."""
        state = self.state
        pool, rows = state.kv_pool, state.req_to_token_pool
        live = [r for r in state.prefilling + state.running if r.req_pool_idx is not None]
        owned = torch.zeros(pool.num_slots + 1, dtype=torch.bool, device=pool.device)
        owned[0] = True  # the padding slot
        owned[pool.free_slots()] = True
        stack = list(state.tree.root.children.values())
        while stack:
            node = stack.pop()
            owned[cat_slots([node.value]).to(pool.device)] = True
            stack.extend(node.children.values())
        for r in live:
            owned[state.req_to_token[r.req_pool_idx, r.tree_len:r.computed_len].long()] = True
        leaked = (~owned).nonzero().flatten()
        pool.free(leaked)
        held = {r.req_pool_idx for r in live} | set(rows.free_rows())
        for req in state.waiting:  # half admitted when the step failed
            if req.status == ReqStatus.WAITING and req.req_pool_idx is not None:
                if req.last_node is not None:
                    state.tree.unlock(req.last_node)
                req.req_pool_idx, req.last_node, req.tree_len, req.computed_len = None, None, 0, 0
        for idx in range(rows.size):
            if idx not in held:
                rows.free(idx)
        return int(leaked.numel())
