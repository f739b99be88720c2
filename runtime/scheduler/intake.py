"""A GenerateReq becomes a waiting Req: checked against the model, continued from its session,
given its thinking, stop checker and constraint (compiled in the background); once the
constraint compiled, the request is admissible (`resolve_grammars`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ..messages import Finish, GenerateReq
from .req import Req
from .stops import new_stop_checker

if TYPE_CHECKING:
    from .failures import Failures
    from .forced_tokens import ForcedTokens
    from .grammar import SchedulerGrammar
    from .reasoning import SchedulerReasoning
    from .sessions import Continuation
    from .state import SchedulerState


class Intake:
    def __init__(self, state: SchedulerState, grammars: SchedulerGrammar,
                 reasoning: SchedulerReasoning, forced: ForcedTokens, failures: Failures):
        self.state, self.grammars, self.reasoning = state, grammars, reasoning
        self.forced, self.failures = forced, failures

    def add(self, msg: GenerateReq) -> None:
        """Queue the request, or finish it at once with a 400 saying why it cannot run."""
        state = self.state
        state.num_arrivals += 1
        req = Req.from_message(msg, state.num_arrivals, state.device)
        cont = None
        if msg.session is not None:
            cont = state.sessions.continuation(req.rid, msg.session, req.input_ids,
                                               cache_salt=req.cache_salt)
            if isinstance(cont, str):
                state.finish(req, Finish(type="abort", message=cont, status_code=400))
                return
            req.input_ids = cont.input_ids
        error = self._validate(req) or self.reasoning.start(req, msg.reasoning)
        if error is not None:
            state.finish(req, Finish(type="abort", message=error, status_code=400))
            return
        if cont is not None:
            self._fit_session_request(req, cont)
        if msg.sampling.stop or msg.sampling.stop_regex:
            req.stop_checker = new_stop_checker(state.tokenizer, req)
        if msg.sampling.constraint is not None:
            rejected = self.grammars.submit(req)  # compiles in the background
            if rejected is not None:
                state.finish(req, rejected)
                return
        state.by_rid[req.rid] = req
        state.waiting.append(req)
        if cont is not None:
            for displaced in state.sessions.commit(cont, req):
                self.abort(displaced.rid, f"replaced by request {req.rid!r} of session "
                                          f"{msg.session.id!r} (session_params.replace)")

    def abort(self, rid: str, why: str) -> None:
        req = self.state.by_rid.get(rid)
        if req is not None and req.finish is None:
            self.state.finish(req, Finish(type="abort", message=why))

    def resolve_grammars(self) -> None:
        """Requests whose constraint compiled become admissible; failed compiles finish."""
        state = self.state
        has_work = state.prefilling or state.running or any(
            r.pending_grammar is None for r in state.waiting)
        ready, failed = self.grammars.resolve(state.waiting, block=not has_work)
        for req, finish in failed:
            state.finish(req, finish)
        for req in ready:
            with self.failures.isolate(req):
                self.reasoning.grammar_ready(req)  # dormant while the request thinks
                if req.can_jump:  # a forced start ('{"name": "') is prefilled with the prompt
                    self.forced.jump_forward(req)

    def _fit_session_request(self, req: Req, cont: Continuation) -> None:
        """max_new_tokens cut to what the context and the session's capacity leave (the HTTP
        side could only count the request's own tokens)."""
        room = min(self.state.context_len - len(req.input_ids), self.state.sessions.room(cont))
        params = req.sampling
        if params.max_new_tokens > room:
            req.sampling = dataclasses.replace(
                params, max_new_tokens=room, min_new_tokens=min(params.min_new_tokens, room))

    def _validate(self, req: Req) -> str | None:
        state = self.state
        if not req.input_ids:
            return "the prompt is empty"
        if len(req.input_ids) >= state.context_len:
            return (f"the prompt has {len(req.input_ids)} tokens; this model's context is "
                    f"{state.context_len} tokens")
        if len(req.input_ids) >= state.kv_pool.num_slots:
            return (f"the prompt has {len(req.input_ids)} tokens; the KV pool holds "
                    f"{state.kv_pool.num_slots}")
        vocab_size = state.runner.vocab_size
        bad = [t for t in req.input_ids if not 0 <= t < vocab_size]
        if bad:
            return (f"input_ids contains ids outside the vocabulary "
                    f"[0, {vocab_size}): {bad[:5]}")
        return None
