"""Scheduler: continuous batching over the radix cache. `step(inbox) -> outbox`, no sockets.

One step = handle messages, run one prefill ("extend") batch if there is prefill work (at most
--prefill-budget-while-decoding tokens while others decode, so their streams keep their pace),
then one decode batch if requests are running, and report every request that got new tokens.
With overlap scheduling (overlap.py) the decode batch is launched on a forward thread and its
tokens are sampled at the next step, the CPU work of each step running beside a forward pass.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import msgspec
import torch

from radixflow.radix_cache import RadixTree

from ..forward_batch import ForwardMode
from ..messages import (
    AbortReq,
    CloseSessionReq,
    Finish,
    FlushCacheDone,
    FlushCacheReq,
    GenerateReq,
    Message,
    OpenSessionDone,
    OpenSessionReq,
    SchedulerStats,
    SessionsClosed,
    TokenBatchOut,
)
from ..model_runner import BatchRequest, ModelRunner
from ..reasoning import ReasoningParser
from ..sampling import SampleOutput, SamplingBatch, compute_logprobs, sample, top_logprobs
from ..server_args import ServerArgs, chat_template_text
from .admission import Budget, ExtendPlan, order_waiting, plan_extend
from .failures import Failures, forward_in_parts
from .grammar import MaskJob, SchedulerGrammar
from .kv_cache import KVCache, cat_slots, evictable_len
from .output import make_output
from .overlap import ForwardThread, InFlight
from .reasoning import SchedulerReasoning
from .req import Req, ReqStatus
from .sessions import Continuation, Sessions

logger = logging.getLogger(__name__)

# Prefill tokens of a step while others decode, on a CPU: a longer chunk stalls every running
# stream for its whole prefill; 256 tokens compute at the per-token cost of 1,024 there
# (bench/results/prefill-*.md) while a stream waits about a quarter as long.
DECODE_PREFILL_BUDGET_CPU = 256


class Scheduler:
    def __init__(self, args: ServerArgs, *, model_folder=None, hf_config: dict | None = None,
                 tokenizer=None):
        from ..model_loader import load_config, load_tokenizer, resolve_model

        self.args = args
        self.model_folder = model_folder or resolve_model(args.model)
        hf_config = hf_config or load_config(self.model_folder)
        self.tokenizer = tokenizer or load_tokenizer(args.tokenizer or self.model_folder)
        if args.chat_template is not None:
            self.tokenizer.chat_template = chat_template_text(args.chat_template)
        self.runner = ModelRunner(args, self.model_folder, hf_config)
        self.tree = RadixTree(disabled=args.disable_radix_cache)
        self.kv_pool, self.req_to_token_pool = self.runner.kv_pool, self.runner.req_to_token_pool
        self.req_to_token = self.req_to_token_pool.req_to_token
        self.kv = KVCache(self.tree, self.kv_pool, self.req_to_token_pool)
        # the draws of requests that carry no seed of their own (--seed)
        self.generator = torch.Generator(device=self.runner.device).manual_seed(args.seed)
        self.eos_ids = self._eos_ids(hf_config)
        self.waiting: list[Req] = []
        self.prefilling: list[Req] = []  # hold a row; prompt computed in chunks
        self.running: list[Req] = []  # decoding
        self.by_rid: dict[str, Req] = {}
        self._arrivals = 0
        self._touched: dict[str, Req] = {}  # requests to report this step
        self.grammars = SchedulerGrammar(
            self.tokenizer, self.runner.vocab_size, stop_token_ids=sorted(self.eos_ids),
            compile_timeout=args.grammar_compile_timeout,
            compile_threads=args.grammar_compile_threads,
            jump_forward=not args.disable_jump_forward,
            budget_safe=not args.disable_budget_safe_close, context_len=self.runner.context_len)
        self.reasoning = SchedulerReasoning(
            ReasoningParser.load(args.reasoning_parser, self.tokenizer), self.eos_ids,
            self.runner.vocab_size)
        self.sessions = Sessions(getattr(self.tokenizer, "bos_token_id", None),
                                 max_open=args.max_open_sessions,
                                 max_requests=args.max_session_requests,
                                 max_timeout=args.max_session_timeout)
        self.failures = Failures(self)  # failures.py: one request's failure fails it alone
        self.prefill_budget = min(args.max_prefill_tokens, args.prefill_budget_while_decoding or (
            DECODE_PREFILL_BUDGET_CPU if self.runner.device.type == "cpu"
            else args.max_prefill_tokens))
        self.stats = {"cache_hit_tokens": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.num_retractions = 0
        # overlap.py: decode passes run on a forward thread, one step ahead of their CPU work
        self.overlap = self._overlap_wanted()
        self.forward_thread = ForwardThread() if self.overlap else None
        self.in_flight: InFlight | None = None
        self.num_forward_passes = 0
        self.num_request_forwards = 0  # requests taking part, summed over forward passes

    # ---- public ----

    @property
    def is_idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.running or self.in_flight)

    @property
    def context_len(self) -> int:
        return self.runner.context_len

    def model_info(self) -> dict:
        return {
            "model_path": str(self.model_folder),
            "context_length": self.context_len,
            "max_total_tokens": self.kv_pool.num_slots,
            "max_running_requests": self.args.max_running_requests,
            "vocab_size": self.runner.vocab_size,
            "eos_token_ids": sorted(self.eos_ids),
            "dtype": str(self.runner.dtype).removeprefix("torch."),
            "quantization": self.runner.quantization,
            "device": str(self.runner.device),
            "kv_cache_dtype": str(self.runner.kv_dtype).removeprefix("torch."),
            "cpu": self.runner.cpu_info(),
            "reasoning_parser": self.args.reasoning_parser,
        }

    def step(self, inbox: list[Message]) -> list[Message]:
        out: list[Message] = []
        if self.sessions:
            self.sessions.reap()
        for msg in inbox:
            self._handle(msg, out)
        self.failures.guard(self._run_batches)
        expired = self.sessions.take_expired()
        if expired:
            out.append(SessionsClosed(session_ids=expired))
        if self._touched:
            outputs = [make_output(r) for r in self._touched.values()]
            self._touched.clear()
            outputs = [o for o in outputs if o is not None]
            if outputs:
                out.append(TokenBatchOut(outputs=outputs))
        return out

    def _run_batches(self) -> None:
        self._resolve_grammars()
        if self.prefilling or any(r.pending_grammar is None for r in self.waiting):
            self._drain()  # (admission may reuse the rows and slots of the pass in flight)
            self._run_extend()
        if self.overlap:
            self._run_decode_overlapped()
        elif any(r.seq_len > r.computed_len for r in self.running):
            self._run_decode()

    def stats_message(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running) + len(self.prefilling), num_waiting=len(self.waiting),
            kv_used_tokens=(self.kv_pool.num_slots - self.kv_pool.num_free
                            - self.tree.evictable_size()),
            kv_total_tokens=self.kv_pool.num_slots, **self.stats)

    def check_slots(self) -> None:
        """Invariant: free + tree + held by live requests == total (call when consistent)."""
        self.kv.check(self.prefilling + self.running)

    # ---- messages ----

    def _handle(self, msg: Message, out: list[Message]) -> None:
        if isinstance(msg, GenerateReq):
            self.failures.add_request(msg)  # (_add_request; its failure fails it alone)
        elif isinstance(msg, AbortReq):
            self._abort(msg.rid, "aborted by the client")
        elif isinstance(msg, FlushCacheReq):
            out.append(FlushCacheDone(success=self._flush_cache()))
        elif isinstance(msg, OpenSessionReq):
            error, status = self.sessions.open(msg.session_id, msg.capacity_of_str_len,
                                               msg.timeout) or (None, None)
            out.append(OpenSessionDone(session_id=msg.session_id, success=error is None,
                                       message=error, status_code=status))
        elif isinstance(msg, CloseSessionReq):
            if not self.sessions.close(msg.session_id):
                logger.info("close_session: no open session %r", msg.session_id)
        else:
            logger.warning("scheduler ignores unexpected message %s", type(msg).__name__)

    def _add_request(self, msg: GenerateReq) -> None:
        self._arrivals += 1
        req = Req.from_message(msg, self._arrivals, self.runner.device)
        cont = None
        if msg.session is not None:
            cont = self.sessions.continuation(req.rid, msg.session, req.input_ids)
            if isinstance(cont, str):
                self._finish(req, Finish(type="abort", message=cont, status_code=400))
                return
            req.input_ids = cont.input_ids
        error = self._validate(req) or self.reasoning.start(req, msg.reasoning)
        if error is not None:
            self._finish(req, Finish(type="abort", message=error, status_code=400))
            return
        if cont is not None:
            self._fit_session_request(req, cont)
        if msg.sampling.stop or msg.sampling.stop_regex:
            req.stop_checker = self._new_stop_checker(req)
        if msg.sampling.constraint is not None:
            rejected = self.grammars.submit(req)  # compiles in the background
            if rejected is not None:
                self._finish(req, rejected)
                return
        self.by_rid[req.rid] = req
        self.waiting.append(req)
        if cont is not None:
            for displaced in self.sessions.commit(cont, req):
                self._abort(displaced.rid, f"replaced by request {req.rid!r} of session "
                                           f"{msg.session.id!r} (session_params.replace)")

    def _fit_session_request(self, req: Req, cont: Continuation) -> None:
        """max_new_tokens cut to what the context and the session's capacity leave (the HTTP
        side could only count the request's own tokens)."""
        room = min(self.context_len - len(req.input_ids), self.sessions.room(cont))
        params = req.sampling
        if params.max_new_tokens > room:
            req.sampling = dataclasses.replace(
                params, max_new_tokens=room, min_new_tokens=min(params.min_new_tokens, room))

    def _new_stop_checker(self, req: Req):
        from ..detokenize import IncrementalDetokenizer

        # The prompt context, as in the detokenizer: a stop string is found where the text
        # the client gets has it.
        s = req.sampling
        return IncrementalDetokenizer(self.tokenizer, stop=s.stop, stop_regex=s.stop_regex,
                                      skip_special_tokens=s.skip_special_tokens,
                                      spaces_between_special_tokens=s.spaces_between_special_tokens,
                                      prompt_ids=req.input_ids)

    def _resolve_grammars(self) -> None:
        """Requests whose constraint compiled become admissible; failed compiles finish."""
        has_work = self.prefilling or self.running or any(
            r.pending_grammar is None for r in self.waiting)
        ready, failed = self.grammars.resolve(self.waiting, block=not has_work)
        for req, finish in failed:
            self._finish(req, finish)
        for req in ready:
            with self.failures.isolate(req):
                self.reasoning.grammar_ready(req)  # dormant while the request thinks
                if req.can_jump:  # a forced start ('{"name": "') is prefilled with the prompt
                    self._jump_forward(req)

    def _validate(self, req: Req) -> str | None:
        if not req.input_ids:
            return "the prompt is empty"
        if len(req.input_ids) >= self.context_len:
            return (f"the prompt has {len(req.input_ids)} tokens; this model's context is "
                    f"{self.context_len} tokens")
        if len(req.input_ids) >= self.kv_pool.num_slots:
            return (f"the prompt has {len(req.input_ids)} tokens; the KV pool holds "
                    f"{self.kv_pool.num_slots}")
        bad = [t for t in req.input_ids if not 0 <= t < self.runner.vocab_size]
        if bad:
            return (f"input_ids contains ids outside the vocabulary "
                    f"[0, {self.runner.vocab_size}): {bad[:5]}")
        return None

    def _abort(self, rid: str, why: str) -> None:
        req = self.by_rid.get(rid)
        if req is not None and req.finish is None:
            self._finish(req, Finish(type="abort", message=why))

    def _flush_cache(self) -> bool:
        if not self.is_idle:
            return False
        self.kv.flush()
        return True

    # ---- prefill ----

    def _run_extend(self) -> None:
        # Running requests need a slot each for decode, or one per forced token (jump-forward).
        reserved = sum(max(1, r.seq_len - r.computed_len) for r in self.running)
        budget = Budget(
            tokens=self.prefill_budget if self.running else self.args.max_prefill_tokens,
            kv_slots=self.kv_pool.num_free + self.tree.evictable_size() - reserved,
            rows=self.req_to_token_pool.num_free,
            running=self.args.max_running_requests - len(self.running) - len(self.prefilling))
        matches = {}

        def match(req: Req):
            if req not in matches:
                matches[req] = self.tree.match_prefix(req.fill_ids)
            return matches[req]

        def match_len(req: Req) -> int:
            return self._prefix_cap(req, match(req).length)

        ready = [r for r in self.waiting if r.pending_grammar is None]  # not compiling
        waiting = order_waiting(ready, self.args.schedule_policy, match_len)
        plans = plan_extend(self.prefilling, waiting, budget, self.args.chunk_size,
                            lambda r: r.seq_len - match_len(r),
                            lambda r: evictable_len(match(r).last_node))
        if not plans:
            return
        for plan in plans:
            if plan.req.status == ReqStatus.WAITING:
                self._admit(plan.req)
        self._extend(plans)

    def _prefix_cap(self, req: Req, matched: int) -> int:
        """Cached tokens usable: leave one token to compute, and the prompt-logprob window."""
        cap = req.seq_len - 1
        if req.wants_input_logprobs and not req.reported_input_logprobs:
            cap = min(cap, req.logprob_start_len)
        return min(matched, cap)

    def _admit(self, req: Req) -> None:
        match = self.tree.match_prefix(req.fill_ids)
        cached = self._prefix_cap(req, match.length)
        node = match.last_node
        if cached < match.length:  # only part of the match is used: lock a shorter path
            match = self.tree.match_prefix(req.fill_ids[:cached])
            node = match.last_node
        req.req_pool_idx = self.req_to_token_pool.alloc()
        self.tree.lock(node)
        req.last_node, req.tree_len, req.computed_len = node, cached, cached
        if cached:
            self.req_to_token[req.req_pool_idx, :cached] = cat_slots(match.values).to(torch.int32)
        if req.num_retractions == 0:
            req.cached_len = cached
            self.stats["cache_hit_tokens"] += cached
            self.stats["prompt_tokens"] += len(req.input_ids)
        if req.wants_input_logprobs and req.input_logprobs is None:
            start = min(req.logprob_start_len, len(req.input_ids) - 1)
            req.logprob_start_len = start
            req.input_logprobs = [None] * (len(req.input_ids) - start)
            if req.top_logprobs_num:
                req.input_top_logprobs = [None] * (len(req.input_ids) - start)
        self.waiting.remove(req)
        req.status = ReqStatus.PREFILLING
        self.prefilling.append(req)

    def _extend(self, plans: list[ExtendPlan]) -> None:
        parts, slot_chunks, sample_reqs, sample_rows, logprob_rows = [], [], [], [], []
        row = 0
        for plan in plans:
            req, n = plan.req, plan.extend_len
            start = req.computed_len
            slots = self.kv.alloc(n)
            self.req_to_token[req.req_pool_idx, start:start + n] = slots.to(torch.int32)
            slot_chunks.append(slots)
            completes = start + n == req.seq_len
            offsets = []
            if req.wants_input_logprobs and not req.reported_input_logprobs:
                # logits at position p score prompt token p + 1
                lo = max(start, req.logprob_start_len)
                hi = min(start + n, len(req.input_ids) - 1)
                offsets = [p - start for p in range(lo, hi)]
                logprob_rows.append((req, lo, row, len(offsets)))
            if completes and req.num_tokens_left > 0:
                if not offsets or offsets[-1] != n - 1:
                    offsets.append(n - 1)
                sample_reqs.append(req)
                sample_rows.append(row + len(offsets) - 1)
            row += len(offsets)
            parts.append(BatchRequest(req.req_pool_idx, req.fill_ids[start:start + n], start,
                                      offsets))
        mask = self.grammars.start_fill(sample_reqs)  # overlaps the forward
        logits = self._forward(ForwardMode.EXTEND, parts, torch.cat(slot_chunks))
        for plan in plans:
            plan.req.computed_len += plan.extend_len
        for req, lo, first_row, count in logprob_rows:
            self._record_input_logprobs(req, lo, logits[first_row:first_row + count])
        for plan in plans:
            req = plan.req
            if req.computed_len < req.seq_len:
                self.kv.cache_unfinished(req)  # chunked: later chunks (and peers) reuse it
                continue
            prefilled = req.status == ReqStatus.PREFILLING
            if prefilled:
                self.prefilling.remove(req)
                req.status = ReqStatus.RUNNING
                self.running.append(req)
            if req.wants_input_logprobs:
                self._touched[req.rid] = req
            if req.num_tokens_left <= 0:
                self._finish(req, Finish(type="length", length=req.sampling.max_new_tokens))
            elif prefilled and req.num_retractions == 0:
                self.kv.cache_unfinished(req)  # share the prompt with requests still waiting
        if sample_reqs:
            self._sample(sample_reqs, logits[sample_rows], mask)

    def _record_input_logprobs(self, req: Req, lo: int, logits: torch.Tensor) -> None:
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

    # ---- decode ----

    def _run_decode(self) -> None:
        """One token per running request, plus the tokens jump-forward appended without
        sampling: each is its own query row of the same decode pass, so a jump costs no
        extra forward.

        NOTE: rows of one request see each other's K/V because every layer writes the pass's
        K/V into the pool before attention reads it; row i attends to positions < seq_len_i.
        """
        reqs, parts, slots = self._plan_decode(
            [r for r in self.running if r.seq_len > r.computed_len])
        if not reqs:
            return
        mask = self.grammars.start_fill(reqs)  # overlaps the forward
        logits = self._forward(ForwardMode.DECODE, parts, slots)
        self._sample(reqs, logits, mask)

    def _plan_decode(self, reqs: list[Req]) -> tuple[list[Req], list[BatchRequest], torch.Tensor]:
        """Slots and query rows for every uncomputed token of `reqs` (the last of each wants
        logits), marked computed: (the requests kept, parts, slots). Retraction may drop some."""
        slots = self._alloc_for_decode(reqs)
        reqs = [r for r in reqs if r.status == ReqStatus.RUNNING]  # retraction removes some
        parts, used = [], 0
        for req in reqs:
            start, end = req.computed_len, req.seq_len
            self.req_to_token[req.req_pool_idx, start:end] = \
                slots[used:used + end - start].to(torch.int32)
            used += end - start
            parts += [BatchRequest(req.req_pool_idx, [req.token_at(pos)], pos,
                                   [0] if pos == end - 1 else []) for pos in range(start, end)]
            req.computed_len = end
        return reqs, parts, slots[:used]

    # ---- overlapped decode (overlap.py) ----

    def _overlap_wanted(self) -> bool:
        """On where the scheduler's CPU work has a core the forward does not use: on a GPU,
        or a CPU with more cores than forward threads. Where the forward takes every core
        (2 cores, 2 threads), the work it would hide competes with the forward's own threads
        and the thread hand-offs add to the gap: bench/results/overlap-*.md measured it
        3-6% slower there, so it is off unless --enable-overlap-schedule."""
        args = self.args
        if args.disable_overlap_schedule:
            return False
        if args.tp_size > 1:
            logger.info("overlap scheduling is off under --tp-size > 1")
            return False
        if args.enable_overlap_schedule or self.runner.device.type != "cpu":
            return True
        spare = (os.cpu_count() or 1) > torch.get_num_threads()
        if not spare:
            logger.info("overlap scheduling is off: the forward runs on all %d cores "
                        "(--enable-overlap-schedule turns it on)", torch.get_num_threads())
        return spare

    def _run_decode_overlapped(self) -> None:
        """Sample the pass in flight, launch the next with its tokens, then do the CPU work of
        the tokens sampled while the new pass computes."""
        prev, self.in_flight = self.in_flight, None
        reqs, picked = self._pick_in_flight(prev) if prev is not None else ([], None)
        for req, token in zip(reqs, picked.next_ids.tolist() if picked else []):
            req.output_ids.append(token)  # tentatively: the next pass computes it
        launch = [r for r in self.running
                  if r.seq_len > r.computed_len and not self._ends_at_once(r)]
        launched, parts, slots = self._plan_decode(launch) if launch else ([], [], None)
        if launched:
            future = self.forward_thread.submit(self._forward, ForwardMode.DECODE, parts, slots)
            self.in_flight = InFlight(launched, [r.seq_len for r in launched], future)
        for req in reqs:
            req.output_ids.pop()  # committed below, as a synchronous step would
        if reqs:
            self._commit(reqs, picked)
        if self.in_flight is not None:
            live = [r for i, r in enumerate(self.in_flight.reqs) if self.in_flight.still_valid(i)]
            self.in_flight.mask = self.grammars.start_fill(live)  # after the accepts above
            self.in_flight.masked = live

    def _ends_at_once(self, req: Req) -> bool:
        """Whether a request's tentative token surely ends it (no pass needed after it)."""
        if req.num_tokens_left <= 0 or req.seq_len >= self.context_len:
            return True
        token = req.output_ids[-1] if req.output_ids else None
        return token in req.sampling.stop_token_ids or (
            token in self.eos_ids and not req.sampling.ignore_eos)

    def _pick_in_flight(self, prev: InFlight) -> tuple[list[Req], SampleOutput | None]:
        """Wait for the pass; sample the rows still valid: (their requests, the draw)."""
        logits = prev.logits.result()
        keep = [i for i in range(len(prev.reqs)) if prev.still_valid(i)]
        bitmask = mask_rows = None
        if prev.mask is not None:
            full = self.grammars.wait(prev.mask, logits.device)
            row_of = {id(r): k for k, r in enumerate(prev.masked)}
            masked_rows = set(prev.mask.rows)
            rows = [row_of[id(prev.reqs[i])] for i in keep]
            mask_rows = [j for j, row in enumerate(rows) if row in masked_rows]
            bitmask = full[rows] if mask_rows else None
            mask_rows = mask_rows or None
        if not keep:
            return [], None
        reqs = [prev.reqs[i] for i in keep]
        if len(keep) < len(prev.reqs):
            logits = logits[keep]
        return reqs, self._pick(reqs, logits, bitmask, mask_rows)

    def _drain(self) -> None:
        """Sample and commit the pass in flight, launching none."""
        prev, self.in_flight = self.in_flight, None
        if prev is not None:
            reqs, picked = self._pick_in_flight(prev)
            if reqs:
                self._commit(reqs, picked)

    def shutdown(self) -> None:
        if self.forward_thread is not None:
            self.forward_thread.shutdown()

    def _alloc_for_decode(self, reqs: list[Req]) -> torch.Tensor:
        """A slot per uncomputed token; retract the requests with the most tokens left until
        it fits."""
        while True:
            live = [r for r in reqs if r.status == ReqStatus.RUNNING]
            slots = self.kv.try_alloc(sum(r.seq_len - r.computed_len for r in live))
            if slots is not None:
                return slots
            if len(live) <= 1:
                raise RuntimeError("KV pool too small to decode even one request")
            victim = max(live, key=lambda r: (r.num_tokens_left, r.arrival))
            self._retract(victim)

    def _forward(self, mode: ForwardMode, parts: list[BatchRequest],
                 slots: torch.Tensor) -> torch.Tensor:
        self.num_forward_passes += 1
        self.num_request_forwards += len({part.req_pool_idx for part in parts})
        return forward_in_parts(self.runner.forward, mode, parts, slots)  # halves if it fails

    # ---- sampling and finishing ----

    def _sample(self, reqs: list[Req], logits: torch.Tensor, mask: MaskJob | None) -> None:
        bitmask, mask_rows = None, None
        if mask is not None:
            bitmask, mask_rows = self.grammars.wait(mask, logits.device), mask.rows
        self._commit(reqs, self._pick(reqs, logits, bitmask, mask_rows))

    def _pick(self, reqs: list[Req], logits: torch.Tensor, bitmask: torch.Tensor | None,
              mask_rows: list[int] | None) -> SampleOutput:
        """One token per request from its logits row (grammar bitmask rows `mask_rows`)."""
        batch = SamplingBatch.build(
            [r.sampling for r in reqs], [r.output_ids for r in reqs],
            [r.input_ids for r in reqs], [r.generator for r in reqs], sorted(self.eos_ids),
            self.runner.vocab_size, logits.device)
        bitmask, mask_rows = self.reasoning.masks(reqs, bitmask, mask_rows, logits.device)
        top_k = max((r.top_logprobs_num for r in reqs if r.return_logprob), default=0)
        need_logprobs = any(r.return_logprob for r in reqs)
        result = sample(logits, batch, bitmask=bitmask, mask_rows=mask_rows,
                        top_logprobs_num=top_k, need_logprobs=need_logprobs,
                        backend=self.args.sampling_backend, generator=self.generator)
        return result

    def _commit(self, reqs: list[Req], result: SampleOutput) -> None:
        """Append each request's drawn token (or close it early), check stops, jump."""
        next_ids = result.next_ids.tolist()
        need_logprobs = any(r.return_logprob for r in reqs)
        logprobs = result.logprobs.tolist() if need_logprobs else [0.0] * len(reqs)
        tops = None
        if result.top_logprobs is not None:
            tops = [list(zip(v, i)) for v, i in
                    zip(result.top_logprobs[0].tolist(), result.top_logprobs[1].tolist())]
        for i, (req, token) in enumerate(zip(reqs, next_ids)):
            try:  # (a try costs nothing; a `with` per token would)
                closing = self.grammars.closing(req, token) if req.grammar is not None else None
                if closing is not None:  # the token would leave no completion within the budget
                    self._close_early(req, closing)
                    continue
                self._append_token(req, token, logprobs[i],
                                   tops[i][:req.top_logprobs_num] if tops else None)
                if req.can_jump and req.finish is None:
                    self._jump_forward(req)
            except Exception as exc:
                self.failures.request_failed(req, exc)  # fails it alone (or re-raises)

    def _append_token(self, req: Req, token: int, logprob: float,
                      top: list[tuple[float, int]] | None) -> None:
        req.output_ids.append(token)
        self.stats["generation_tokens"] += 1
        if req.return_logprob:
            req.pending_logprobs.append(logprob)
            if req.top_logprobs_num:
                req.pending_top_logprobs.append(top or [])
        self._touched[req.rid] = req
        finish = self._check_finish(req, token)
        if finish is not None:
            self._finish(req, finish)

    def _check_finish(self, req: Req, token: int) -> Finish | None:
        thinking = self.reasoning.consumes(req, token)  # the grammar never sees the thinking
        if req.grammar is not None and not thinking:
            finish = self.grammars.accept(req, token)
            if finish is not None:
                return finish
        elif token in self.eos_ids and not req.sampling.ignore_eos:
            return Finish(type="stop", matched=token)
        return self._check_stops(req, token)

    def _check_stops(self, req: Req, token: int) -> Finish | None:
        """Stop ids and strings, max_new_tokens and the context, after `token` was appended."""
        params = req.sampling
        if token in params.stop_token_ids:
            return Finish(type="stop", matched=token)
        if req.stop_checker is not None:
            req.stop_checker.append([token])
            if req.stop_checker.matched_stop is not None:
                return Finish(type="stop", matched=req.stop_checker.matched_stop)
            if req.stop_checker.error is not None:  # a stop_regex too slow to search
                return Finish(type="abort", message=req.stop_checker.error, status_code=400)
        if req.num_tokens_left <= 0:
            return Finish(type="length", length=params.max_new_tokens)
        if req.seq_len >= self.context_len:
            return Finish(type="length", length=len(req.output_ids))
        return None

    # ---- jump-forward (see grammar.py for why output is held back) ----

    def _jump_forward(self, req: Req) -> None:
        """Append the tokens the grammar forces, unsampled; end with EOS if nothing else may
        follow. The next decode pass computes the forced tokens along with everyone's."""
        jump = self.grammars.find_jump(req, max_replaced=self._num_replaceable(req))
        if jump is not None:
            self._touched[req.rid] = req
            self._drop_output(req, jump.num_replaced)
            for token in jump.token_ids:
                req.output_ids.append(token)
                self.stats["generation_tokens"] += 1
                finish = self._check_stops(req, token)
                if finish is not None:
                    self._finish(req, finish)
                    return
        stop_id = self.grammars.forced_stop(req)
        if stop_id is not None:  # the EOS a sampler would have been forced to pick
            req.output_ids.append(stop_id)
            self.stats["generation_tokens"] += 1
            self._finish(req, Finish(type="stop", matched=stop_id))

    def _close_early(self, req: Req, tokens: list[int]) -> None:
        """Budget-safe closing (grammar.py): append the completion and EOS unsampled (their
        logprobs are NaN: nothing scored them) and finish, closed_early."""
        self._touched[req.rid] = req
        self._forget_uncomputed(req)  # (overlap: the pass in flight computed the dropped token)
        for k, token in enumerate(tokens):
            req.output_ids.append(token)
            self.stats["generation_tokens"] += 1
            if req.return_logprob:
                req.pending_logprobs.append(math.nan)
                if req.top_logprobs_num:
                    req.pending_top_logprobs.append([])
            last = k == len(tokens) - 1
            finish = Finish(type="stop", matched=token) if last else self._check_stops(req, token)
            if finish is not None:
                self._finish(req, msgspec.structs.replace(finish, closed_early=True))
                return

    def _num_replaceable(self, req: Req) -> int:
        """Trailing output tokens a jump may rewrite: not streamed yet, slots not the tree's."""
        in_tree = max(0, req.tree_len - len(req.input_ids))
        answer_start = req.thinking.answer_start if req.thinking is not None else 0
        return len(req.output_ids) - max(req.sent_len, in_tree, answer_start)

    def _drop_output(self, req: Req, num_tokens: int) -> None:
        """Forget the last `num_tokens` output tokens, freeing the KV computed for them."""
        if num_tokens <= 0:
            return
        del req.output_ids[-num_tokens:]
        self.stats["generation_tokens"] -= num_tokens
        self._forget_uncomputed(req)
        if req.stop_checker is not None:  # it cannot take tokens back: rebuild it
            req.stop_checker = self._new_stop_checker(req)
            req.stop_checker.append(req.output_ids)

    def _forget_uncomputed(self, req: Req) -> None:
        """Free the KV computed past the request's tokens (those were taken back)."""
        if req.req_pool_idx is not None and req.computed_len > req.seq_len:
            dropped = self.req_to_token[req.req_pool_idx, req.seq_len:req.computed_len]
            self.kv_pool.free(dropped.long())
            req.computed_len = req.seq_len

    def _finish(self, req: Req, finish: Finish) -> None:
        req.finish = finish
        self._touched[req.rid] = req
        if req.session_node is not None:
            self.sessions.finished(req, refused=finish.status_code is not None)
        if req.status in (ReqStatus.PREFILLING, ReqStatus.RUNNING):
            self.kv.release(req)
            (self.prefilling if req.status == ReqStatus.PREFILLING else self.running).remove(req)
        elif req.status == ReqStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED
        self.by_rid.pop(req.rid, None)

    # ---- retraction ----

    def _retract(self, req: Req) -> None:
        logger.info("KV pool full: retracting request %s (%d tokens left)", req.rid,
                    req.num_tokens_left)
        self.kv.release(req)
        self.running.remove(req)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.num_retractions += 1
        self.waiting.insert(0, req)

    # ---- helpers ----

    def _grammar_backend(self):
        return self.grammars.backend

    def _eos_ids(self, hf_config: dict) -> set[int]:
        ids = set(self.runner.model_args.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        gen_config = self.model_folder / "generation_config.json"
        if gen_config.exists():
            import json

            eos = json.loads(gen_config.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        return ids
