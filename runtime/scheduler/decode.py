"""Decode: one token per running request, plus the tokens jump-forward appended without
sampling, each its own query row of the same pass (so a jump costs no extra forward). A slot
per uncomputed token; when the KV pool is short, the requests with the most tokens left are
retracted (back to waiting, recomputed from the tree when readmitted).

Overlapped decoding: the model computes step N+1 while the scheduler finishes step N. Without
overlap a decode step is: forward, sample, then the CPU work on the sampled tokens (stop
strings, grammars, jump-forward, outputs for the detokenizer, new messages, the next batch),
during which the model idles. With overlap (SGLang's overlap scheduler, here on a forward
thread), the scheduler samples step N, appends each token tentatively, launches step N+1's
forward at once on that thread, and only then does step N's CPU work, while the forward runs.
Step N+1's grammar masks are filled after step N's tokens are accepted, still during its
forward.

What step N's work decides after N+1 was launched is handled when N+1's logits come back:
a row whose request finished, was aborted or retracted, or jumped forward (its sequence
changed) is dropped unsampled; its K/V writes were to slots it owned at launch, and since the
forward thread runs one pass at a time, no later pass can read a slot before an earlier pass
wrote it. Anything that admits requests (prefill) first drains the pass in flight.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..forward_batch import BatchRequest, ForwardMode
from .device import use_device
from .req import Req, ReqStatus
from .window_kv import free_behind_windows

if TYPE_CHECKING:
    from ..sampling import SampleOutput
    from ..server_args import ServerArgs
    from .commit import Commit
    from .grammar import MaskJob, SchedulerGrammar
    from .speculate import Draft, Speculate
    from .state import SchedulerState

logger = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A decode pass on the forward thread: one logits row per request in `reqs`."""

    reqs: list[Req]
    seq_lens: list[int]  # each request's length at launch: a row is valid while it holds
    logits: Future  # -> torch.Tensor [len(reqs), vocab]
    mask: MaskJob | None = None  # filled for `masked` after the tokens before were accepted
    masked: list[Req] | None = None

    def still_valid(self, i: int) -> bool:
        req = self.reqs[i]
        return (req.status == ReqStatus.RUNNING and req.finish is None
                and req.seq_len == self.seq_lens[i])


class ForwardThread:
    """One thread that runs forward passes in the order they are submitted, on `device`."""

    def __init__(self, device: torch.device):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixflow-forward",
                                        initializer=use_device, initargs=(device,))

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(torch.inference_mode()(fn), *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class Decode:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar, commit: Commit,
                 *, overlap: bool, speculate: Speculate):
        self.state, self.grammars, self.commit = state, grammars, commit
        self.speculate = speculate
        self.overlap = overlap
        self.forward_thread = ForwardThread(state.device) if overlap else None

    def run(self) -> None:
        # a speculating request's next tokens depend on its last verify: those steps run
        # synchronously (the pass in flight first)
        if self.overlap and not self.speculate.any_wanted(self.state.running):
            self._run_overlapped()
            return
        if self.overlap:
            self.drain()
        if any(r.seq_len > r.computed_len for r in self.state.running):
            self._run_sync()

    def shutdown(self) -> None:
        if self.forward_thread is not None:
            self.forward_thread.shutdown()

    # ---- planning ----

    def plan(self, reqs: list[Req], drafts: dict[Req, Draft] | None = None
             ) -> tuple[list[Req], list[BatchRequest], torch.Tensor]:
        """Slots and query rows for every uncomputed token of `reqs` (the last of each wants
        logits) and each drafted one (each wants logits), marked computed: (the requests
        kept, parts, slots). Retraction may drop some.

        NOTE: rows of one request see each other's K/V because every layer writes the pass's
        K/V into the pool before attention reads it; row i attends to positions < seq_len_i.
        """
        drafts = drafts or {}
        free_behind_windows(self.state, reqs)  # before allocating: the slots are reused
        slots = self.alloc(reqs, drafts)
        reqs = [r for r in reqs if r.status == ReqStatus.RUNNING]  # retraction removes some
        req_to_token = self.state.req_to_token
        parts, used = [], 0
        for req in reqs:
            start, end = req.computed_len, req.seq_len
            draft = drafts[req].tokens if req in drafts else []
            n = end - start + len(draft)
            req_to_token[req.req_pool_idx, start:start + n] = \
                slots[used:used + n].to(torch.int32)
            used += n
            parts += [BatchRequest(req.req_pool_idx, [req.token_at(pos)], pos,
                                   [0] if pos == end - 1 else []) for pos in range(start, end)]
            parts += [BatchRequest(req.req_pool_idx, [token], end + i, [0])
                      for i, token in enumerate(draft)]
            req.computed_len = start + n  # (speculate.commit takes back the rejected drafts)
        return reqs, parts, slots[:used]

    def alloc(self, reqs: list[Req], drafts: dict[Req, Draft] | None = None) -> torch.Tensor:
        """A slot per uncomputed token (and drafted one); retract the requests with the most
        tokens left until it fits (under --enable-priority-scheduling the highest priority
        value first). A retracted request's draft goes with it."""
        drafts = drafts or {}
        while True:
            live = [r for r in reqs if r.status == ReqStatus.RUNNING]
            slots = self.state.kv.try_alloc(sum(
                r.seq_len - r.computed_len + (len(drafts[r].tokens) if r in drafts else 0)
                for r in live))
            if slots is not None:
                return slots
            if len(live) <= 1:
                raise RuntimeError("KV pool too small to decode even one request")
            if self.state.args.enable_priority_scheduling:  # the highest value goes first
                victim = max(live, key=lambda r: (r.priority, r.num_tokens_left, r.arrival))
            else:
                victim = max(live, key=lambda r: (r.num_tokens_left, r.arrival))
            logger.info("KV pool full: retracting request %s (%d tokens left)", victim.rid,
                        victim.num_tokens_left)
            retract(self.state, victim)

    # ---- one pass, then its tokens ----

    def _run_sync(self) -> None:
        started = time.perf_counter()
        reqs = [r for r in self.state.running if r.seq_len > r.computed_len]
        drafts = self.speculate.propose(reqs)
        reqs, parts, slots = self.plan(reqs, drafts)
        if not reqs:
            return
        drafts = {r: drafts[r] for r in reqs if r in drafts}
        if drafts:  # a verify pass: rows for the drafted tokens too
            mask = self.speculate.start_fill(reqs, drafts)
            logits = self.state.forward(ForwardMode.DECODE, parts, slots)
            self.speculate.commit(reqs, logits, drafts, mask)
        else:
            mask = self.grammars.start_fill(reqs)  # overlaps the forward
            logits = self.state.forward(ForwardMode.DECODE, parts, slots)
            self.commit.sample(reqs, logits, mask)
        self.speculate.observe_pass(len(parts), time.perf_counter() - started)

    # ---- overlapped: the next pass computes while this one's tokens are committed ----

    def _run_overlapped(self) -> None:
        """Sample the pass in flight, launch the next with its tokens, then do the CPU work of
        the tokens sampled while the new pass computes."""
        state = self.state
        prev, state.in_flight = state.in_flight, None
        reqs, picked = self._pick_in_flight(prev) if prev is not None else ([], None)
        for req, token in zip(reqs, picked.next_ids.tolist() if picked else []):
            req.output_ids.append(token)  # tentatively: the next pass computes it
        launch = [r for r in state.running
                  if r.seq_len > r.computed_len and not self._ends_at_once(r)]
        launched, parts, slots = self.plan(launch) if launch else ([], [], None)
        if launched:
            future = self.forward_thread.submit(state.forward, ForwardMode.DECODE, parts, slots)
            state.in_flight = InFlight(launched, [r.seq_len for r in launched], future)
        for req in reqs:
            req.output_ids.pop()  # committed below, as a synchronous step would
        if reqs:
            self.commit.commit(reqs, picked)
        in_flight = state.in_flight
        if in_flight is not None:
            live = [r for i, r in enumerate(in_flight.reqs) if in_flight.still_valid(i)]
            in_flight.mask = self.grammars.start_fill(live)  # after the accepts above
            in_flight.masked = live

    def _ends_at_once(self, req: Req) -> bool:
        """Whether a request's tentative token surely ends it (no pass needed after it)."""
        if req.num_tokens_left <= 0 or req.seq_len >= self.state.context_len:
            return True
        token = req.output_ids[-1] if req.output_ids else None
        return token in req.sampling.stop_token_ids or (
            token in self.state.eos_ids and not req.sampling.ignore_eos)

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
        return reqs, self.commit.pick(reqs, logits, bitmask, mask_rows)

    def drain(self) -> None:
        """Sample and commit the pass in flight, launching none."""
        prev, self.state.in_flight = self.state.in_flight, None
        if prev is not None:
            reqs, picked = self._pick_in_flight(prev)
            if reqs:
                self.commit.commit(reqs, picked)


def retract(state: SchedulerState, req: Req) -> None:
    """Send a running request back to the front of the queue; its computed tokens go to the
    tree, so readmitting it recomputes only what was evicted meanwhile."""
    state.kv.release(req)
    state.running.remove(req)
    req.status = ReqStatus.WAITING
    req.num_retractions += 1
    state.num_retractions += 1
    state.waiting.insert(0, req)


def overlap_wanted(args: ServerArgs, device: torch.device) -> bool:
    """On where the scheduler's CPU work has a core the forward does not use: on a GPU, or a
    CPU with more cores than forward threads. Where the forward takes every core (2 cores, 2
    threads), the work it would hide competes with the forward's own threads and the thread
    hand-offs add to the gap: measured 3-6% slower there (bench/results/overlap.md), so it is
    off unless --enable-overlap-schedule."""
    if args.disable_overlap_schedule:
        return False
    if args.tp_size > 1:
        logger.info("overlap scheduling is off under --tp-size > 1")
        return False
    if args.enable_overlap_schedule or device.type != "cpu":
        return True
    spare = (os.cpu_count() or 1) > torch.get_num_threads()
    if not spare:
        logger.info("overlap scheduling is off: the forward runs on all %d cores "
                    "(--enable-overlap-schedule turns it on)", torch.get_num_threads())
    return spare
