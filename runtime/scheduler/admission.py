"""Which waiting requests enter the next prefill batch, and how many tokens each computes.

Budgets: `max_prefill_tokens` per batch, `chunk_size` per request per step, free request rows,
`max_running_requests`, and KV slots (free + evictable). A request that shares a long
uncached prefix with one already admitted in this batch (under the same cache_salt) waits one
round, so the prefix is computed once and then found in the tree. Under priority scheduling,
the first request that finds no room is recorded (`Budget.blocked`, for priority.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixflow.radix_cache import common_prefix_len

from .req import Req

# A request sharing more than this many not-yet-cached tokens with one admitted in the same
# batch is deferred until that one's prefix is in the tree.
IN_BATCH_SHARE_THRESHOLD = 32


@dataclass
class ExtendPlan:
    req: Req
    extend_len: int


@dataclass
class Blocked:
    """The first waiting request that found no room: it needs a running place and a row
    (`place`), and `kv_slots` more KV slots than are left. The prefill token budget running
    out is not being blocked (the next step has a fresh one)."""

    req: Req
    place: bool
    kv_slots: int


@dataclass
class Budget:
    tokens: int  # prefill tokens left in this batch
    kv_slots: int  # free + evictable KV slots left
    rows: int  # free request rows left
    running: int  # running-request places left
    blocked: Blocked | None = field(default=None)  # set by plan_extend

    def fits(self, n: int) -> bool:
        return n <= self.tokens and n <= self.kv_slots

    def take(self, n: int, new_row: bool) -> None:
        self.tokens -= n
        self.kv_slots -= n
        if new_row:
            self.rows -= 1
            self.running -= 1


def order_waiting(waiting: list[Req], policy: str, match_len, *,
                  priority: bool = False) -> list[Req]:
    """Longest-prefix-match first (ties by arrival), or first come first served; with
    `priority`, lower `req.priority` values first and the policy within one value."""
    def key(r: Req) -> tuple:
        first = (r.priority,) if priority else ()
        return (*first, r.arrival) if policy == "fcfs" else (*first, -match_len(r), r.arrival)

    return sorted(waiting, key=key)


def plan_extend(continuing: list[Req], waiting: list[Req], budget: Budget, chunk_size: int,
                uncached_len, lock_cost=None) -> list[ExtendPlan]:
    """Continuing chunked requests first, then waiting ones in the order given.

    `uncached_len(req)` is how many fill tokens the request still has to compute once its
    cached prefix is taken into account; `lock_cost(req)` how many evictable KV slots its
    cached prefix holds (admission locks them, so they can no longer be evicted for it).
    """
    plans: list[ExtendPlan] = []
    for req in continuing:
        n = min(req.seq_len - req.computed_len, chunk_size, budget.tokens, budget.kv_slots)
        if n <= 0:
            break
        budget.take(n, new_row=False)
        plans.append(ExtendPlan(req, n))
    admitted: list[Req] = []
    for req in waiting:
        if budget.tokens <= 0:
            break
        todo = uncached_len(req)
        if _shares_uncached_prefix(req, todo, admitted):
            continue
        n = min(todo, chunk_size, budget.tokens)
        cost = lock_cost(req) if lock_cost is not None else 0
        no_place = budget.rows <= 0 or budget.running <= 0
        # Admit only when the whole rest of the prompt will fit in KV (chunks may follow).
        if no_place or todo + cost > budget.kv_slots:
            budget.blocked = Blocked(req, no_place, max(0, todo + cost - budget.kv_slots))
            break
        budget.take(n, new_row=True)
        budget.kv_slots -= todo - n + cost  # reserve the later chunks too
        plans.append(ExtendPlan(req, n))
        admitted.append(req)
    return plans


def _shares_uncached_prefix(req: Req, todo: int, admitted: list[Req]) -> bool:
    cached = req.seq_len - todo
    ids = req.fill_ids
    for other in admitted:
        if other.cache_salt != req.cache_salt:  # another namespace: it would not find it
            continue
        if common_prefix_len(other.fill_ids, ids) - cached > IN_BATCH_SHARE_THRESHOLD:
            return True
    return False
