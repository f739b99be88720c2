"""Sessions (SGLang's `open_session` / `close_session` / `session_params`): a request continues
the token history of an earlier request of its session, so the client never sends it again.

A session is a tree of its requests. A request that names `session_params.rid` gets as its
prompt that request's prompt and output (`history`), then its own tokens:

    prompt = history[:offset] + own      history = rid's prompt + rid's output
                                         (rid's prompt only with drop_previous_output)

exactly as SGLang's session controller builds it: `offset` None or 0 appends at the end (a
Python slice otherwise, so negative offsets count from the end); a leading BOS of `own` is
dropped; no `rid` starts a new branch with no history. `replace` aborts `rid` if it still
runs and drops the requests that continued it (with no `rid`: drops every request of the
session). Appending to a request that has not finished is refused.

Only token ids are kept here: the KV of the history is the radix tree's like any other
prefix, so a continuation finds it cached (unless it was evicted, then it is recomputed).
Each node stores what it added to its parent (`own` + its output), so a session holds the
tokens it was sent and generated once, not once per turn. `capacity_of_str_len` bounds every
request of the session, history included, in tokens: a longer prompt is refused and
max_new_tokens is cut to what is left. Closing a session (or its `timeout`) forgets the
tree; requests still running finish normally (as in SGLang) but cannot be continued.

Limits (ServerArgs): at most `max_open_sessions` are open at once (opening another is refused
with status 429: try again once one closes or times out); an idle session lives at most
`max_session_timeout` seconds (`timeout: null` means that, a longer one is clipped to it); a
session holds at most `max_session_requests` requests (a request past it is refused, 400).
Its first request fixes the session's `cache_salt` (its radix-tree namespace): a later request
with another salt (or none where it had one) is refused, 400, since its history is cached there.
Sessions closed by their timeout are reported (`take_expired`), so the HTTP side can forget
them too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..messages import SessionParams
from .req import Req

REAP_INTERVAL_S = 1.0
TOO_MANY_SESSIONS = 429  # OpenSessionDone.status_code when max_open_sessions are open


@dataclass(eq=False)
class SessionNode:
    """One request of a session: what it added to its parent's tokens."""

    session: Session
    rid: str
    parent: SessionNode | None
    keep: int  # leading tokens of the parent's sequence (prompt + output) its prompt starts with
    own: list[int]  # the request's own tokens, after those
    max_new_tokens: int
    req: Req | None  # while the request runs; then None and `output` holds its output
    output: list[int] = field(default_factory=list)
    children: list[SessionNode] = field(default_factory=list)

    def output_ids(self) -> list[int]:
        ids = self.req.output_ids if self.req is not None else self.output
        return ids[:self.max_new_tokens]


@dataclass(eq=False)
class Session:
    session_id: str
    capacity: int  # capacity_of_str_len: the most tokens one request may hold, history included
    timeout: float | None
    last_active: float
    nodes: dict[str, SessionNode] = field(default_factory=dict)  # by rid
    salt_fixed: bool = False  # by its first request: then every request sends `cache_salt`
    cache_salt: str | None = None

    def is_timed_out(self, now: float) -> bool:
        return self.timeout is not None and now - self.last_active > self.timeout

    def num_tokens(self) -> int:
        """Token ids this session keeps (what its requests added; running outputs included)."""
        return sum(len(n.own) + len(n.output_ids()) for n in self.nodes.values())


@dataclass
class Continuation:
    """A session request's prompt, checked but not yet recorded (see Sessions.commit)."""

    session: Session
    params: SessionParams
    parent: SessionNode | None
    keep: int
    own: list[int]
    input_ids: list[int]  # the whole prompt: history[:offset] + own


def _sequence(node: SessionNode, *, with_output: bool = True) -> list[int]:
    """The node's prompt and (with_output) its output, rebuilt from the root down."""
    chain = []
    n: SessionNode | None = node
    while n is not None:
        chain.append(n)
        n = n.parent
    seq: list[int] = []
    for n in reversed(chain):
        del seq[n.keep:]
        seq.extend(n.own)
        if n is not node or with_output:
            seq.extend(n.output_ids())
    return seq


class Sessions:
    """Every open session of a scheduler. Methods return an error message (str) where the
    client asked for something that cannot be done; the scheduler refuses it with a 400."""

    def __init__(self, bos_token_id: int | None, *, max_open: int = 256,
                 max_requests: int = 1024, max_timeout: float = 3600.0):
        self.bos_token_id = bos_token_id
        self.max_open, self.max_requests, self.max_timeout = max_open, max_requests, max_timeout
        self.sessions: dict[str, Session] = {}
        self._last_reap = 0.0
        self._expired: list[str] = []  # closed by their timeout, not reported yet

    def __len__(self) -> int:
        return len(self.sessions)

    # ---- lifetime ----

    def open(self, session_id: str, capacity: int, timeout: float | None,
             now: float | None = None) -> tuple[str, int] | None:
        """None, or why the session cannot open and the status that says so (400: the id is
        taken; 429: max_open sessions are open)."""
        now = time.monotonic() if now is None else now
        if self._get(session_id, now) is not None:
            return (f"a session with id {session_id!r} is already open; close it first or open "
                    "one with another id"), 400
        if len(self.sessions) >= self.max_open:
            self._last_reap = 0.0
            self.reap(now)
            if len(self.sessions) >= self.max_open:
                return (f"too many open sessions: the server holds at most {self.max_open} "
                        "(--max-open-sessions); close one or retry later"), TOO_MANY_SESSIONS
        timeout = self.max_timeout if timeout is None else min(timeout, self.max_timeout)
        self.sessions[session_id] = Session(session_id, capacity, timeout, now)
        return None

    def close(self, session_id: str) -> bool:
        """Forget the session; False if there was none (closing twice is harmless)."""
        return self.sessions.pop(session_id, None) is not None

    def reap(self, now: float | None = None) -> None:
        """Close the sessions whose timeout passed (at most once per REAP_INTERVAL_S)."""
        now = time.monotonic() if now is None else now
        if now - self._last_reap < REAP_INTERVAL_S:
            return
        self._last_reap = now
        for sid in [s.session_id for s in self.sessions.values() if s.is_timed_out(now)]:
            del self.sessions[sid]
            self._expired.append(sid)

    def take_expired(self) -> list[str]:
        """The ids of the sessions closed by their timeout since the last call."""
        expired, self._expired = self._expired, []
        return expired

    def _get(self, session_id: str, now: float) -> Session | None:
        session = self.sessions.get(session_id)
        if session is not None and session.is_timed_out(now):
            del self.sessions[session_id]
            self._expired.append(session_id)
            return None
        return session

    # ---- requests ----

    def continuation(self, rid: str, params: SessionParams, input_ids: list[int],
                     now: float | None = None, *,
                     cache_salt: str | None = None) -> Continuation | str:
        """The prompt of request `rid` (its own tokens `input_ids`) in session `params.id`,
        or why it cannot have one. Changes nothing but the session's last activity."""
        now = time.monotonic() if now is None else now
        session = self._get(params.id, now)
        if session is None:
            return (f"session_params.id: no open session {params.id!r} (it was never opened, "
                    "was closed, or timed out); open one with /open_session")
        session.last_active = now
        if session.salt_fixed and cache_salt != session.cache_salt:
            had = "a cache_salt" if session.cache_salt is not None else "no cache_salt"
            return (f"cache_salt: session {params.id!r} was started with {had}; every request "
                    "of a session must send the same cache_salt (its history is cached under it)")
        if rid in session.nodes:
            return (f"rid {rid!r} is already a request of session {params.id!r}; a request's "
                    "rid names it in its session, so it must be new")
        if len(session.nodes) >= self.max_requests and not (params.replace and params.rid is None):
            return (f"session {params.id!r} holds {len(session.nodes)} requests, the most one "
                    f"session may hold (--max-session-requests); close it and open another, or "
                    "send session_params.replace with no rid to start it over")
        parent = None
        if params.rid is not None:
            parent = session.nodes.get(params.rid)
            if parent is None:
                return (f"session_params.rid: {params.rid!r} is not a request of session "
                        f"{params.id!r}")
            if parent.req is not None and not params.replace:
                return (f"session_params.rid: request {params.rid!r} of session {params.id!r} "
                        "has not finished; wait for it, or set session_params.replace to abort "
                        "it and continue from what it generated")
        own, keep = list(input_ids), 0
        if parent is None:
            prompt = own
        else:
            if own and self.bos_token_id is not None and own[0] == self.bos_token_id:
                own = own[1:]  # the history already starts the text (SGLang trims it too)
            history = _sequence(parent, with_output=not params.drop_previous_output)
            if params.offset:  # SGLang: an offset of 0 (or none) appends at the end
                history = history[:params.offset]
            keep = len(history)
            prompt = history + own
        if len(prompt) > session.capacity:
            return (f"the prompt, session history included, has {len(prompt)} tokens; session "
                    f"{params.id!r} holds at most {session.capacity} (its capacity_of_str_len)")
        return Continuation(session, params, parent, keep, own, prompt)

    def room(self, cont: Continuation) -> int:
        """How many tokens the request may generate within the session's capacity."""
        return cont.session.capacity - len(cont.input_ids)

    def commit(self, cont: Continuation, req: Req) -> list[Req]:
        """Record the admitted request in its session; return the running requests that
        `replace` displaces (the scheduler aborts them)."""
        session, parent = cont.session, cont.parent
        if not session.salt_fixed:
            session.salt_fixed, session.cache_salt = True, req.cache_salt
        displaced: list[Req] = []
        if cont.params.replace:
            if parent is None:
                for node in session.nodes.values():
                    if node.req is not None:
                        displaced.append(node.req)
                session.nodes.clear()
            else:
                if parent.req is not None:
                    displaced.append(parent.req)
                for child in parent.children:
                    displaced.extend(self._drop(child))
                parent.children = []
        node = SessionNode(session, req.rid, parent, cont.keep, cont.own,
                           req.sampling.max_new_tokens, req)
        if parent is not None:
            parent.children.append(node)
        session.nodes[req.rid] = node
        req.session_node = node
        return displaced

    def _drop(self, node: SessionNode) -> list[Req]:
        """Forget `node` and everything that continued it; their running requests."""
        running = []
        todo = [node]
        while todo:
            n = todo.pop()
            todo.extend(n.children)
            if n.session.nodes.get(n.rid) is n:
                del n.session.nodes[n.rid]
            if n.req is not None:
                running.append(n.req)
        return running

    def finished(self, req: Req, *, refused: bool) -> None:
        """Keep the finished request's output as its node's; a request the scheduler refused
        (its grammar failed to compile, ...) leaves the session as if never sent."""
        node = req.session_node
        if node is None:
            return
        req.session_node = None
        node.output = list(req.output_ids[:node.max_new_tokens])
        node.req = None
        if refused and not node.children:
            if node.session.nodes.get(node.rid) is node:
                del node.session.nodes[node.rid]
            if node.parent is not None and node in node.parent.children:
                node.parent.children.remove(node)
