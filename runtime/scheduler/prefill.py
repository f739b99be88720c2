"""Prefill ("extend"): which waiting requests enter the batch and how many tokens each computes
(admission.py decides, under the budgets), then their rows, cached prefixes and slots, the
pass, the prompt logprobs, and the first token of each request whose prompt is complete."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..forward_batch import BatchRequest, ForwardMode
from ..messages import Finish
from ..sampling import compute_logprobs, top_logprobs
from . import embedding
from .admission import Budget, ExtendPlan, order_waiting, plan_extend
from .kv_cache import cat_slots, evictable_len
from .priority import Preemption
from .req import Req, ReqStatus

if TYPE_CHECKING:
    from radixflow.radix_cache import MatchResult

    from ..server_args import ServerArgs
    from .commit import Commit
    from .grammar import SchedulerGrammar
    from .state import SchedulerState

# Prefill tokens of a step while others decode, on a CPU: a longer chunk stalls every running
# stream for its whole prefill; 256 tokens compute at the per-token cost of 1,024 there while
# a stream waits about a quarter as long (bench/results/prefill.md).
DECODE_PREFILL_BUDGET_CPU = 256


def prefill_budget_while_decoding(args: ServerArgs, device: torch.device) -> int:
    return min(args.max_prefill_tokens, args.prefill_budget_while_decoding or (
        DECODE_PREFILL_BUDGET_CPU if device.type == "cpu" else args.max_prefill_tokens))


class Prefill:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar, commit: Commit):
        self.state, self.grammars, self.commit = state, grammars, commit
        self.budget_while_decoding = prefill_budget_while_decoding(state.args, state.device)
        self.preemption = Preemption(state) if state.args.enable_priority_scheduling else None
        self.blocked = None  # the waiting request the last plan() found no room for

    def run(self) -> None:
        """Admit what fits and compute one chunk of every prefilling request."""
        embedding.refuse_mismatched(self.state)  # (a generation on an embedding server, ...)
        plans = self.plan()
        if self.preemption is not None and self.preemption.make_room(self.blocked):
            plans = self.plan()  # with the room the retracted requests left
        if not plans:
            return
        for plan in plans:
            if plan.req.status == ReqStatus.WAITING:
                self._admit(plan.req)
        self._extend(plans)

    def plan(self) -> list[ExtendPlan]:
        """This step's chunks: the prefilling requests' next ones, then the waiting requests
        admission lets in (changes nothing)."""
        state, args = self.state, self.state.args
        # Running requests need a slot each for decode, or one per forced token (jump-forward).
        reserved = sum(max(1, r.seq_len - r.computed_len) for r in state.running)
        budget = Budget(
            tokens=self.budget_while_decoding if state.running else args.max_prefill_tokens,
            kv_slots=state.kv_pool.num_free + state.tree.evictable_size() - reserved,
            rows=state.req_to_token_pool.num_free,
            running=args.max_running_requests - len(state.running) - len(state.prefilling))
        matches: dict[Req, MatchResult] = {}

        def match(req: Req) -> MatchResult:
            if req not in matches:
                matches[req] = state.tree.match_prefix(req.fill_ids, namespace=req.cache_salt)
            return matches[req]

        def match_len(req: Req) -> int:
            return prefix_cap(state, req, match(req).length)

        ready = [r for r in state.waiting if r.pending_grammar is None]  # not compiling
        waiting = order_waiting(ready, args.schedule_policy, match_len,
                                priority=self.preemption is not None)
        plans = plan_extend(state.prefilling, waiting, budget, args.chunk_size,
                            lambda r: r.seq_len - match_len(r),
                            lambda r: evictable_len(match(r).last_node))
        self.blocked = budget.blocked
        return plans

    def _admit(self, req: Req) -> None:
        state = self.state
        match = state.tree.match_prefix(req.fill_ids, namespace=req.cache_salt)
        cached = prefix_cap(state, req, match.length)
        node = match.last_node
        if cached < match.length:  # only part of the match is used: lock a shorter path
            match = state.tree.match_prefix(req.fill_ids[:cached], namespace=req.cache_salt)
            node = match.last_node
        req.req_pool_idx = state.req_to_token_pool.alloc()
        state.tree.lock(node)
        req.last_node, req.tree_len, req.computed_len = node, cached, cached
        if cached:
            state.req_to_token[req.req_pool_idx, :cached] = \
                cat_slots(match.values).to(torch.int32)
        if req.num_retractions == 0:
            if cached:
                state.tree.record_hit(node)
            req.cached_len = cached
            state.stats["cache_hit_tokens"] += cached
            state.stats["prompt_tokens"] += len(req.input_ids)
        if req.wants_input_logprobs and req.input_logprobs is None:
            start = min(req.logprob_start_len, len(req.input_ids) - 1)
            req.logprob_start_len = start
            req.input_logprobs = [None] * (len(req.input_ids) - start)
            if req.top_logprobs_num:
                req.input_top_logprobs = [None] * (len(req.input_ids) - start)
        state.waiting.remove(req)
        req.status = ReqStatus.PREFILLING
        state.prefilling.append(req)

    def _extend(self, plans: list[ExtendPlan]) -> None:
        state = self.state
        parts, slot_chunks, sample_reqs, sample_rows, logprob_rows = [], [], [], [], []
        embed_rows = []  # (req, start, first row, rows, slots): hidden states to pool
        row = 0
        for plan in plans:
            req, n = plan.req, plan.extend_len
            start = req.computed_len
            slots = state.kv.alloc(n)
            state.req_to_token[req.req_pool_idx, start:start + n] = slots.to(torch.int32)
            slot_chunks.append(slots)
            completes = start + n == req.seq_len
            offsets = []
            if req.embed is not None:  # its rows are hidden states: pooled, never sampled
                offsets = embedding.wanted_rows(state, req, start, n)
                embed_rows.append((req, start, row, len(offsets), slots))
            elif req.wants_input_logprobs and not req.reported_input_logprobs:
                # logits at position p score prompt token p + 1
                lo = max(start, req.logprob_start_len)
                hi = min(start + n, len(req.input_ids) - 1)
                offsets = [p - start for p in range(lo, hi)]
                logprob_rows.append((req, lo, row, len(offsets)))
            if completes and req.num_tokens_left > 0 and req.embed is None:
                if not offsets or offsets[-1] != n - 1:
                    offsets.append(n - 1)
                sample_reqs.append(req)
                sample_rows.append(row + len(offsets) - 1)
            row += len(offsets)
            parts.append(BatchRequest(req.req_pool_idx, req.fill_ids[start:start + n], start,
                                      offsets))
        mask = self.grammars.start_fill(sample_reqs)  # overlaps the forward
        logits = state.forward(ForwardMode.EXTEND, parts, torch.cat(slot_chunks))
        for plan in plans:
            plan.req.computed_len += plan.extend_len
        for req, lo, first_row, count in logprob_rows:
            record_input_logprobs(req, lo, logits[first_row:first_row + count])
        for req, start, first_row, count, slots in embed_rows:
            embedding.pool_chunk(state, req, start, logits[first_row:first_row + count], slots)
        for plan in plans:
            self._after_chunk(plan.req)
        if sample_reqs:
            self.commit.sample(sample_reqs, logits[sample_rows], mask)

    def _after_chunk(self, req: Req) -> None:
        """A chunk was computed: cache it; a complete prompt starts decoding."""
        state = self.state
        if req.computed_len < req.seq_len:
            state.kv.cache_unfinished(req)  # chunked: later chunks (and peers) reuse it
            return
        prefilled = req.status == ReqStatus.PREFILLING
        if prefilled:
            state.prefilling.remove(req)
            req.status = ReqStatus.RUNNING
            state.running.append(req)
        if req.wants_input_logprobs:
            state.touched[req.rid] = req
        if req.embed is not None:
            embedding.finish_embedding(state, req)
        elif req.num_tokens_left <= 0:
            state.finish(req, Finish(type="length", length=req.sampling.max_new_tokens))
        elif prefilled and req.num_retractions == 0:
            state.kv.cache_unfinished(req)  # share the prompt with requests still waiting


def prefix_cap(state: SchedulerState, req: Req, matched: int) -> int:
    """Cached tokens usable: leave one token to compute, and the prompt-logprob window."""
    cap = req.seq_len - 1
    if req.wants_input_logprobs and not req.reported_input_logprobs:
        cap = min(cap, req.logprob_start_len)
    if req.embed is not None:
        cap = embedding.usable_prefix(state, req, cap)
    return min(matched, cap)


def record_input_logprobs(req: Req, lo: int, logits: torch.Tensor) -> None:
    """The prompt logprobs of tokens lo + 1 .. from their logits rows."""
    if logits.shape[0] == 0:
        return
    targets = torch.tensor(req.input_ids[lo + 1:lo + 1 + logits.shape[0]],
                           device=logits.device)
    chosen = compute_logprobs(logits, targets).tolist()
    base = lo + 1 - req.logprob_start_len
    req.input_logprobs[base:base + len(chosen)] = chosen
    if req.top_logprobs_num:
        values, ids = top_logprobs(logits, req.top_logprobs_num)
        tops = [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]
        req.input_top_logprobs[base:base + len(tops)] = tops
