"""Speculative decoding in the decode pass: draft, verify, keep what the model would have made.

Drafting (`propose`): each request that speculates gets up to k tokens from its drafter
(speculative/ngram.py: its prediction, then n-gram matches in its own tokens). A constrained
request's draft is cut at the first token its grammar rejects, walking a fork of its grammar;
the fork's state after each drafted token masks that token's row. Then, if the request does not
jump forward (it asked for logprobs, or --disable-jump-forward), the tokens its grammar forces
after the draft are drafted too. Drafts stop before a stop token, within the request's
max_new_tokens and context, within the free KV slots (a draft never evicts or retracts
anything), and within the rows the C decode step takes in one call (MAX_VERIFY_ROWS
elsewhere), the best recent acceptors first and, among equals, the least verified.

Verifying (`commit`): the pass computes the request's uncomputed tokens and then its drafted
ones, one row each (decode.py's plan), logits at the last real token and at every drafted one.
Every row is sampled as a decode step would sample it, with the output before it (penalties,
min_new_tokens) and its grammar mask; the drafted tokens are accepted while each equals the
token drawn before it. With a draft that is a single token, this is exactly the standard
speculative sampling rule (accept with probability p(d), else draw from p without d): the
outputs keep their distribution, and a greedy output is the one decoding without speculation
makes. The first drawn token that differs (or the one after the last drafted) is the step's new
token, so a step appends 1 + accepted tokens.

KV: the drafted tokens' slots are written by the pass; an accepted token's slot becomes its
KV (the request's computed length moves over it only once the token is committed and the
request is still as expected), every other drafted slot goes back to the pool. The radix tree
only ever gets committed tokens (kv_cache.release inserts a request's computed length).

A prediction's drafts (the client's own text for the output: accepted nearly whole) run up to
--speculative-prediction-draft-tokens (16), the n-grams' up to --speculative-num-draft-tokens
(4): at avx2 on the default model a fully accepted draft of 16 makes a token in ~2.6 ms where
one of 4 takes ~3 ms, and at 8 concurrent requests the cost gate below trims them.

Acceptance steers the draft length (`SpecState.after_verify`): all accepted doubles it, none
halves it, and at zero the request stops drafting for a while (a back-off that doubles each
time), so a request with nothing to copy costs almost nothing.

In a pass of several requests the pass's cost trims the drafts (`_worth_running`): each
drafted row's expected tokens against what a row costs here (speculative/row_cost.py: pass
time by rows, learned from the passes run), so only the rows that raise the tokens a second
run. A batch's products are compute-bound per row at avx2 (int8 products), so a drafted row
of a batch of 8 costs about what a plain row does, and only sure ones pay; a lone request's
drafted rows cost 25-40% of its pass at avx2 (bench/results/speculative.md) and are not trimmed
(its draft length follows its acceptance alone).
A row's expected tokens are its request's recent acceptance rate to the power of its place in
the draft, the rate counted over the drafted tokens a verify *reached* (each one whose
predecessors were all accepted): acceptance is bursty (a copied span is accepted whole, then
its end is rejected), so accepted / drafted would underrate the later tokens of a draft.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..messages import SpecCounts
from ..speculative.ngram import NgramDrafter
from ..speculative.row_cost import RowCost
from .grammar import MaskJob
from .req import ReqStatus

if TYPE_CHECKING:
    from ..constrained import GrammarState
    from ..speculative.config import SpeculationConfig
    from .commit import Commit
    from .grammar import SchedulerGrammar
    from .req import Req
    from .state import SchedulerState

MAX_BACKOFF_STEPS = 64
# A request's acceptance rate before its first verify; a rate moves by this share of each
# verify's, and a request whose drafts are not worth a pass drifts back by DRIFT a step (so
# its drafts get tried again).
PRIOR_RATE = 0.7
RATE_WEIGHT = 0.3
DRIFT = 0.02
# Rows of a verify pass (uncomputed and drafted tokens) beyond which nothing more is drafted,
# where the C decode step does not set the limit (its rows a call: a larger pass would run as
# torch ops, several times slower).
MAX_VERIFY_ROWS = 256


@dataclass
class SpecState:
    """One request's drafter, draft length and counts."""

    drafter: NgramDrafter
    max_k: int
    k: int
    pause: int = 0  # steps left without drafting
    backoff: int = 4  # the next pause
    rate: float = PRIOR_RATE  # recent share of the reached drafted tokens accepted
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("verify_passes", "draft_tokens", "accepted_tokens", "prediction_draft_tokens",
         "prediction_accepted_tokens"), 0))

    def draft_len(self) -> int:
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.k

    def after_verify(self, drafted: int, accepted: int) -> None:
        reached = accepted + (accepted < drafted)  # the first rejected one was reached too
        self.rate += RATE_WEIGHT * (accepted / reached - self.rate)
        if accepted == drafted:
            self.k = min(self.max_k, self.k * 2)
            self.backoff = 4
        elif accepted == 0:
            self.k //= 2
            if self.k == 0:
                self.pause, self.k = self.backoff, 1
                self.backoff = min(MAX_BACKOFF_STEPS, self.backoff * 2)
        else:
            self.k = max(1, min(self.max_k, accepted + 1))

    def report(self) -> SpecCounts:
        return SpecCounts(**self.counts)


@dataclass
class Draft:
    tokens: list[int]
    # row i's grammar state (row 0's is the request's own; None: no grammar)
    states: list[GrammarState | None]
    from_prediction: bool


class Speculate:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar, commit: Commit,
                 config: SpeculationConfig):
        self.state, self.grammars, self.commit_ = state, grammars, commit
        self.config = config
        c_step = getattr(state.runner, "cpu_decode", None)
        self.max_rows = c_step.max_batch if c_step is not None else MAX_VERIFY_ROWS
        self.row_cost = RowCost()
        stats = state.stats
        for key in ("spec_verify_passes", "spec_draft_tokens", "spec_accepted_tokens"):
            stats[key] = 0

    def wants(self, req: Req) -> bool:
        """Whether the request speculates: its own switch, else its prediction or the
        server's flag; never while it thinks (its masks change there) or under a
        max_repeat_run guard (its bans are per step)."""
        on = req.speculative if req.speculative is not None else (
            self.config.on or bool(req.prediction_ids))
        return on and req.thinking is None and not (
            req.grammar is not None and req.sampling.max_repeat_run)

    def any_wanted(self, reqs: list[Req]) -> bool:
        return any(self.wants(r) for r in reqs)

    # ---- drafting ----

    def propose(self, reqs: list[Req]) -> dict[Req, Draft]:
        """Each speculating request's draft (requests without one are left out)."""
        wanting = [r for r in reqs if self.wants(r)]
        if not wanting:
            return {}
        state = self.state
        rows = sum(r.seq_len - r.computed_len for r in reqs)
        free = min(state.kv_pool.num_free - rows, self.max_rows - rows)
        drafts: dict[Req, Draft] = {}
        start_k = self.config.num_draft_tokens
        # the best recent acceptors first; among equals, the ones verified least (a pass whose
        # rows run out would otherwise leave the same requests undrafted step after step)
        wanting.sort(key=lambda r: (-r.spec.k, r.spec.counts["verify_passes"])
                     if r.spec is not None else (-start_k, 0))
        for req in wanting:
            if free <= 0:
                break
            spec = req.spec or self._start(req)
            k = min(spec.draft_len(), req.num_tokens_left - 1,
                    state.context_len - req.seq_len - 1, free)
            if k <= 0:
                continue
            tokens, from_prediction = spec.drafter.draft(req.fill_ids, k)
            tokens = tokens[:self.config.longest_draft(from_prediction)]
            draft = self._checked(req, tokens, from_prediction, k)
            if draft is not None:
                drafts[req] = draft
                free -= len(draft.tokens)
        return self._worth_running(drafts, rows, len(reqs))

    def observe_pass(self, rows: int, seconds: float) -> None:
        """A decode pass of `rows` rows took `seconds`, from its plan to its commit."""
        self.row_cost.observe(rows, seconds)

    def _worth_running(self, drafts: dict[Req, Draft], plain_rows: int,
                       requests: int = 2) -> dict[Req, Draft]:
        """The drafts cut to the rows that raise the expected tokens a second: the i-th
        token of a request's draft is expected to add rate ** i tokens. A pass of one
        request keeps its draft whole (its rows are cheap beside the pass: see above)."""
        if requests <= 1:
            return drafts
        rows = sorted(((-(req.spec.rate ** i), i, req) for req, draft in drafts.items()
                       for i in range(1, len(draft.tokens) + 1)), key=lambda c: c[:2])
        keep = self.row_cost.rows_worth_drafting(plain_rows, [-g for g, _, _ in rows])
        lengths = dict.fromkeys(drafts, 0)
        for _, _, req in rows[:keep]:
            lengths[req] += 1
        kept = {}
        for req, draft in drafts.items():
            n = lengths[req]
            if n == len(draft.tokens):
                kept[req] = draft
            elif n:
                kept[req] = Draft(draft.tokens[:n], draft.states[:n + 1], draft.from_prediction)
            else:  # not worth a row now: its rate drifts back toward the prior
                req.spec.rate += DRIFT * (PRIOR_RATE - req.spec.rate)
        return kept

    def _start(self, req: Req) -> SpecState:
        config = self.config
        drafter = NgramDrafter(config.min_window, config.max_window, req.prediction_ids,
                               num_output_start=len(req.input_ids))
        k = config.longest_draft(bool(req.prediction_ids))
        req.spec = SpecState(drafter, max(k, config.num_draft_tokens), k)
        return req.spec

    def _checked(self, req: Req, tokens: list[int], from_prediction: bool,
                 k: int) -> Draft | None:
        """The draft cut before a stop token and at the first token the grammar rejects, then
        (a request that does not jump forward) extended by the tokens the grammar forces
        after it, with each row's grammar state; None if nothing is left."""
        stops = req.sampling.stop_token_ids
        eos = () if req.sampling.ignore_eos else self.state.eos_ids
        kept = []
        for token in tokens:
            if token in eos or token in stops:
                break
            kept.append(token)
        grammar = req.grammar
        if grammar is None:
            return Draft(kept, [None] * (len(kept) + 1), from_prediction) if kept else None
        if grammar.is_terminated():
            return None
        walk = grammar.fork()
        states: list[GrammarState | None] = [grammar]
        for i, token in enumerate(kept):
            if not walk.accept_token(token):
                kept = kept[:i]
                break
            states.append(walk.fork())
        if not req.can_jump and len(kept) < k:  # (a jumping request appends them anyway)
            forced = walk.jump_forward(self.grammars.tokenizer, req.output_ids + kept,
                                       max_new_tokens=k - len(kept), max_replaced=0)
            for token in forced.token_ids if forced is not None else ():
                if token in eos or token in stops or not walk.accept_token(token):
                    break
                kept.append(token)
                states.append(walk.fork())
        return Draft(kept, states, from_prediction) if kept else None

    # ---- verifying ----

    def start_fill(self, reqs: list[Req], drafts: dict[Req, Draft]) -> MaskJob | None:
        """The pass's bitmask, a row per logits row, filled on the grammar thread."""
        states = []
        for req in reqs:
            draft = drafts.get(req)
            states += draft.states if draft is not None else [req.grammar]
        rows = [i for i, s in enumerate(states) if s is not None]
        if not rows:
            return None
        backend = self.grammars.backend
        bitmask = backend.allocate_bitmask(len(states))
        return MaskJob(bitmask, rows, backend.fill_bitmasks_async(states, bitmask))

    def commit(self, reqs: list[Req], logits: torch.Tensor, drafts: dict[Req, Draft],
               mask: MaskJob | None) -> None:
        """Sample every row, accept the drafted tokens the draws confirm, commit."""
        rows_of, outputs = [], []
        for req in reqs:
            draft = drafts.get(req)
            tokens = draft.tokens if draft is not None else []
            rows_of += [req] * (len(tokens) + 1)
            outputs.append(req.output_ids)  # (a copy only for the rows after a draft)
            outputs += [req.output_ids + tokens[:i] for i in range(1, len(tokens) + 1)]
        bitmask = mask_rows = None
        if mask is not None:
            bitmask, mask_rows = self.grammars.wait(mask, logits.device), mask.rows
        picked = self.commit_.pick(rows_of, logits, bitmask, mask_rows, outputs)
        drawn = picked.next_ids.tolist()
        logprobs = (picked.logprobs.tolist() if picked.logprobs is not None
                    else [0.0] * len(drawn))
        tops = None
        if picked.top_logprobs is not None:
            tops = [list(zip(v, i)) for v, i in zip(picked.top_logprobs[0].tolist(),
                                                     picked.top_logprobs[1].tolist())]
        row = 0
        for req in reqs:
            draft = drafts.get(req)
            n = len(draft.tokens) + 1 if draft is not None else 1
            rows = range(row, row + n)
            row += n
            if draft is None:
                self.commit_.commit_token(req, drawn[rows[0]], logprobs[rows[0]],
                                          tops[rows[0]] if tops else None)
                continue
            self._commit_drafted(req, draft, [drawn[r] for r in rows],
                                 [logprobs[r] for r in rows],
                                 [tops[r] for r in rows] if tops else None)

    def _commit_drafted(self, req: Req, draft: Draft, drawn: list[int],
                        logprobs: list[float], tops: list | None) -> None:
        tokens = draft.tokens
        accepted = 0
        while accepted < len(tokens) and drawn[accepted] == tokens[accepted]:
            accepted += 1
        self._count(req, draft, accepted)
        # the drafted tokens' slots: positions start .. start + len(tokens) - 1
        start = req.seq_len
        req_to_token = self.state.req_to_token
        slots = req_to_token[req.req_pool_idx, start:start + len(tokens)].long().clone()
        req.computed_len = start  # each drafted slot joins once its token is committed
        kept = 0
        for i in range(accepted + 1):
            self.commit_.commit_token(req, drawn[i], logprobs[i], tops[i] if tops else None)
            plain = (req.status == ReqStatus.RUNNING and req.finish is None
                     and req.seq_len == start + i + 1 and req.output_ids[-1] == drawn[i]
                     and req.computed_len == start + i)
            if i == accepted or not plain:
                break
            req.computed_len = start + i + 1  # the drafted token's K/V is this token's
            kept = i + 1
        self.state.kv_pool.free(slots[kept:])

    def _count(self, req: Req, draft: Draft, accepted: int) -> None:
        counts, stats = req.spec.counts, self.state.stats
        counts["verify_passes"] += 1
        counts["draft_tokens"] += len(draft.tokens)
        counts["accepted_tokens"] += accepted
        if draft.from_prediction:
            counts["prediction_draft_tokens"] += len(draft.tokens)
            counts["prediction_accepted_tokens"] += accepted
        stats["spec_verify_passes"] += 1
        stats["spec_draft_tokens"] += len(draft.tokens)
        stats["spec_accepted_tokens"] += accepted
        req.spec.after_verify(len(draft.tokens), accepted)
