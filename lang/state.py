"""ProgramState: what a program function appends to, and the lazy interpreter behind it.

`s += ...` only records nodes (compiled at once to /program wire nodes, roles rendered with
the chat template). Nothing runs until Python needs a value: reading a variable or the text,
forking in stream mode, or the end of the program. Then every node recorded since the last
read goes to the backend as one straight-line stretch (one /program request), so Python
between calls (tool use) splits stretches naturally and a run with k gens and no Python in
between costs one round trip. A fork that is still pending travels inside its parent's
stretch, with each branch's nodes; branches that run later run concurrently.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .errors import BranchError, ForkError, InvalidRequest, VariableNotFound, error_from_wire
from .ir import DEFAULT_PARAMS, Gen, GenParams, NodeLike, RoleBegin, RoleEnd, Select, Text, flatten
from radixflow.runtime.program import ProgramExecutor

_MODEL_NODES = ("gen", "select")


class _PendingFork:
    """A fork recorded in its parent's pending list, not yet executed."""

    def __init__(self, branches: list[ProgramState]):
        self.branches = branches
        self.frozen: list[list[Any]] | None = None  # branch nodes fixed by a lazy join


class _PendingJoin:
    def __init__(self, fork: _PendingFork, mode: str):
        self.fork = fork
        self.mode = mode


def _no_generate(body: dict) -> dict:  # text-only stretches never call the model
    raise AssertionError("a text-only stretch called the model")


def _has_model_node(nodes: list[dict]) -> bool:
    for node in nodes:
        if node["type"] in _MODEL_NODES:
            return True
        if node["type"] == "fork" and any(_has_model_node(b) for b in node["branches"]):
            return True
    return False


class ProgramState:
    """The state of one running program: its text, variables, meta info and chat messages.

    Read with `s["name"]`, `s.text()`, `s.messages()`, `s.get_meta_info(name)`,
    `s.scores(name)`; stream with `s.text_iter(name)`. Reading a variable that no gen/select
    produced raises VariableNotFound; reading from a program or branch that failed raises its
    error (ProgramError / BranchError carry the index).
    """

    def __init__(self, backend: Any, *, defaults: GenParams = DEFAULT_PARAMS, stream: bool = False,
                 _parent: ProgramState | None = None, _branch_index: int | None = None):
        self.backend = backend
        self._defaults = defaults
        self._stream = stream
        self._template = backend.chat_template
        self._text: str = "" if _parent is None else None  # a branch's text arrives with its fork
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._messages: list[dict] = []
        # Static context, known when nodes are appended (roles render from it).
        self._roles: list[str] = [] if _parent is None else list(_parent._roles)
        self._open_role: str | None = None if _parent is None else _parent._open_role
        self._pending: list[Any] = []
        self._lock = threading.Lock()  # guards the fields above; never held across a request
        self._exec_lock = threading.RLock()  # one stretch of this state at a time
        self._error: BaseException | None = None
        self._fork_owner: ProgramState | None = _parent
        self._branch_index = _branch_index
        self._siblings: list[ProgramState] = []
        self._fork_text: str | None = None  # the parent's text where the fork happened
        self._fork_nodes: list[Any] = []  # pending nodes the parent's stretch took with it
        self._fork_wire: list[dict] = []
        self._children: list[list[ProgramState]] = []
        self.num_stretches = 0  # requests this state sent (for tests and curiosity)
        # Streaming: events appended by the executor, read by text_iter.
        self._events: list[tuple[str | None, str]] = []
        self._events_cond = threading.Condition()
        self._finished = _parent is not None or not stream
        self._thread: threading.Thread | None = None
        self.index: int | None = None

    # ---- building ----

    def __iadd__(self, other: NodeLike) -> ProgramState:
        nodes = flatten(other)
        with self._lock:
            for node in nodes:
                self._pending.append(self._compile(node))
        if self._stream:
            self._sync()
        return self

    def _compile(self, node: Any) -> dict:
        if isinstance(node, Text):
            return {"type": "text", "text": node.text}
        if isinstance(node, RoleBegin):
            if self._open_role is not None:
                raise InvalidRequest(f"cannot open a {node.role!r} turn inside the open "
                                     f"{self._open_role!r} turn")
            begin, _ = self._template.role_texts(node.role, self._roles)
            self._open_role = node.role
            return {"type": "role_begin", "role": node.role, "text": begin}
        if isinstance(node, RoleEnd):
            if self._open_role != node.role:
                raise InvalidRequest(f"cannot close a {node.role!r} turn: the open turn is "
                                     f"{self._open_role!r}")
            _, end = self._template.role_texts(node.role, self._roles)
            self._roles.append(node.role)
            self._open_role = None
            return {"type": "role_end", "role": node.role, "text": end}
        if isinstance(node, Gen):
            return self._compile_gen(node)
        if isinstance(node, Select):
            return {"type": "select", "name": node.name, "choices": list(node.choices),
                    "method": node.method}
        raise InvalidRequest(f"cannot add {type(node).__name__} to a program")

    def _compile_gen(self, node: Gen) -> dict:
        params = node.params.merged(self._defaults)
        sampling = params.to_sampling_params()
        if self._open_role == "assistant":
            end_of_turn = self._template.end_of_turn("assistant", self._roles)
            if end_of_turn and end_of_turn not in sampling["stop"]:
                sampling["stop"].append(end_of_turn)
        if node.regex is not None:
            sampling["regex"] = node.regex
        if node.json_schema is not None:
            sampling["json_schema"] = node.json_schema
        out = {"type": "gen", "name": node.name, "sampling_params": sampling}
        if node.return_logprob:
            out.update(return_logprob=True, return_text_in_logprobs=True)
            if node.logprob_start_len is not None:
                out["logprob_start_len"] = node.logprob_start_len
            if node.top_logprobs_num is not None:
                out["top_logprobs_num"] = node.top_logprobs_num
        return out

    @contextlib.contextmanager
    def _role(self, role: str) -> Iterator[ProgramState]:
        self += RoleBegin(role)
        yield self
        self += RoleEnd(role)

    def system(self) -> contextlib.AbstractContextManager[ProgramState]:
        """`with s.system(): s += "..."` writes a system turn."""
        return self._role("system")

    def user(self) -> contextlib.AbstractContextManager[ProgramState]:
        return self._role("user")

    def assistant(self) -> contextlib.AbstractContextManager[ProgramState]:
        return self._role("assistant")

    def fork(self, n: int) -> ForkGroup:
        """n branches that each continue from this point; see ForkGroup.join."""
        if not isinstance(n, int) or not 1 <= n <= 64:
            raise InvalidRequest(f"fork needs 1..64 branches, got {n!r}")
        branches = [ProgramState(self.backend, defaults=self._defaults, stream=self._stream,
                                 _parent=self, _branch_index=i) for i in range(n)]
        for branch in branches:
            branch._siblings = branches
        fork = _PendingFork(branches)
        with self._lock:
            self._pending.append(fork)
            self._children.append(branches)
        if self._stream:
            self._sync()
        return ForkGroup(self, fork)

    # ---- reading ----

    def __getitem__(self, name: str) -> Any:
        self._sync()
        if name not in self._vars:
            raise VariableNotFound(name, list(self._vars))
        return self._vars[name]

    def __contains__(self, name: str) -> bool:
        self._sync()
        return name in self._vars

    def get_var(self, name: str, default: Any = None) -> Any:
        self._sync()
        return self._vars.get(name, default)

    def variables(self) -> dict[str, Any]:
        self._sync()
        return dict(self._vars)

    def text(self) -> str:
        self._sync()
        return self._text

    def messages(self) -> list[dict[str, str]]:
        """The chat turns so far, as {"role", "content"} dicts (closed turns only)."""
        self._sync()
        return [{"role": m["role"], "content": m["content"]} for m in self._messages
                if not m.get("open")]

    def get_meta_info(self, name: str) -> Any:
        self._sync()
        if name not in self._meta:
            raise VariableNotFound(name, list(self._meta))
        return self._meta[name]

    def scores(self, name: str) -> dict[str, float | None]:
        """choice -> score of the select that wrote `name`."""
        meta = self.get_meta_info(name)
        if not isinstance(meta, dict) or "scores" not in meta:
            raise InvalidRequest(f"variable {name!r} was not written by select")
        return dict(zip(meta["choices"], meta["scores"]))

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped this program or branch, or None."""
        return self._error

    @property
    def ok(self) -> bool:
        return self._error is None

    def sync(self) -> ProgramState:
        """Wait until the program (and, in stream mode, its thread) has finished; raise its error."""
        if self._thread is not None:
            self._thread.join()
        self._sync_tree()
        return self

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is generated (stream=True): all of it, or only variable `var_name`.

        Without streaming, yields the final text (or the variable's value) once.
        """
        if not self._stream:
            yield self.text() if var_name is None else str(self[var_name])
            return
        seen = 0
        while True:
            with self._events_cond:
                while seen >= len(self._events) and not self._finished and not (
                        var_name is not None and var_name in self._vars):
                    self._events_cond.wait()
                batch, finished = self._events[seen:], self._finished
                seen += len(batch)
                var_done = var_name is not None and var_name in self._vars
            for name, delta in batch:
                if var_name is None or name == var_name:
                    yield delta
            if (finished or var_done) and seen >= len(self._events):
                break
        if self._error is not None:
            raise self._error

    def __repr__(self) -> str:
        status = "failed" if self._error else ("pending" if self._pending else "done")
        return f"ProgramState({status}, variables={list(self._vars)})"

    # ---- execution ----

    def _sync(self) -> None:
        """Execute everything recorded so far in this state (and the fork that created it)."""
        owner = self._fork_owner
        if owner is not None:
            owner._sync_for_branch()
        with self._exec_lock:
            with self._lock:
                nodes, self._pending = self._pending, []
            if self._error is not None:
                self._fail_nodes(nodes, self._error)
                raise self._error
            if not nodes:
                return
            if self._branch_index is not None:
                self._start_siblings()
            self._execute(nodes)

    def _sync_for_branch(self) -> None:
        """A branch needs its fork executed: run this state's stretch, errors stay here."""
        try:
            self._sync()
        except Exception:
            if self._error is None:
                raise

    def _sync_tree(self) -> None:
        """Execute this state and every branch forked from it (sibling branches concurrently)."""
        self._sync()
        for group in list(self._children):
            threads = [threading.Thread(target=b._sync_tree_quiet, daemon=True) for b in group[1:]]
            for t in threads:
                t.start()
            group[0]._sync_tree_quiet()
            for t in threads:
                t.join()

    def _sync_tree_quiet(self) -> None:
        try:
            self._sync_tree()
        except Exception:  # stored on the branch; raised when it is read or joined
            if self._error is None:
                raise

    def _start_siblings(self) -> None:
        for sibling in self._siblings:
            if sibling is not self and sibling._pending and sibling._fork_owner is None:
                threading.Thread(target=sibling._sync_tree_quiet, daemon=True).start()

    def _execute(self, nodes: list[Any]) -> None:
        wire = [self._to_wire(n) for n in nodes]
        program = {"text": self._text, "nodes": wire}
        stream_kw = {"stream": True, "on_text": self._on_text} if self._stream else {}
        if not _has_model_node(wire):
            result = ProgramExecutor(_no_generate, keep_exceptions=True,
                                     on_text=stream_kw.get("on_text")).run(program)
        else:
            if getattr(self.backend, "needs_messages", False):
                program["messages"] = [dict(m) for m in self._messages]
            self.num_stretches += 1
            try:
                result = self.backend.run_program(program, **stream_kw)
            except Exception as exc:
                self._fail_nodes(nodes, exc)
                raise
        self._apply(wire, nodes, result)

    def _to_wire(self, node: Any) -> dict:
        if isinstance(node, dict):
            return node
        if isinstance(node, _PendingFork):
            branches = []
            frozen = node.frozen or [None] * len(node.branches)
            for branch, nodes in zip(node.branches, frozen):
                if nodes is None:
                    with branch._lock:
                        nodes, branch._pending = branch._pending, []
                branch._fork_nodes = nodes
                branch._fork_wire = [branch._to_wire(n) for n in nodes]
                branches.append(branch._fork_wire)
            return {"type": "fork", "branches": branches}
        return {"type": "join", "mode": node.mode}

    def _apply(self, wire: list[dict], nodes: list[Any], result: dict) -> None:
        """Fold a /program response into this state (and its forked branches)."""
        error = result.get("error")
        done = len(result["pieces"])
        text_at = self._text
        fork_results = iter(result.get("branches") or [])
        for i, (node, piece) in enumerate(zip(wire, result["pieces"])):
            self._apply_message(node, piece)
            if node["type"] == "fork":
                self._apply_fork(nodes[i], text_at, next(fork_results))
            text_at += piece
        with self._lock:
            self._text = text_at
            self._vars.update(result["variables"])
            self._meta.update(result["meta_info"])
        if error is None:
            return
        for node in nodes[done:]:  # forks that never ran
            if isinstance(node, _PendingFork):
                self._fail_fork(node, "its parent failed before the fork")
        exc = error.get("exception") or error_from_wire(error)
        self._error = exc
        raise exc

    def _apply_fork(self, fork: _PendingFork, text: str, results: list[dict]) -> None:
        for branch, result in zip(fork.branches, results):
            branch._text = branch._fork_text = text
            branch._messages = [dict(m) for m in self._messages]
            branch._fork_owner = None
            try:
                branch._apply(branch._fork_wire, branch._fork_nodes, result)
            except Exception as exc:
                branch._error = BranchError(f"fork branch {branch._branch_index} failed: {exc}",
                                            index=branch._branch_index)
                branch._error.__cause__ = exc

    def _fail_fork(self, fork: _PendingFork, why: str) -> None:
        for branch in fork.branches:
            branch._fork_owner = None
            branch._error = BranchError(f"fork branch {branch._branch_index} did not run: {why}",
                                        index=branch._branch_index)
            for node in branch._fork_nodes:  # forks nested in what the stretch took along
                if isinstance(node, _PendingFork):
                    branch._fail_fork(node, why)

    def _fail_nodes(self, nodes: list[Any], exc: BaseException) -> None:
        self._error = exc
        for node in nodes:
            if isinstance(node, _PendingFork):
                self._fail_fork(node, f"{type(exc).__name__}: {exc}")

    def _apply_message(self, node: dict, piece: str) -> None:
        kind = node["type"]
        if kind == "role_begin":
            self._messages.append({"role": node["role"], "content": "", "open": True})
        elif kind == "role_end":
            if self._messages and self._messages[-1].get("open"):
                self._messages[-1].pop("open")
        elif self._messages and self._messages[-1].get("open"):
            self._messages[-1]["content"] += piece

    def _on_text(self, name: str | None, delta: str) -> None:
        with self._events_cond:
            self._events.append((name, delta))
            self._events_cond.notify_all()

    def _finish(self, error: BaseException | None = None) -> None:
        """End of a streamed program: wake text_iter readers."""
        with self._events_cond:
            if error is not None and self._error is None:
                self._error = error
            self._finished = True
            self._events_cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error


class ForkGroup:
    """The branches of `s.fork(n)`: index or iterate them; `forks += x` adds x to every branch."""

    def __init__(self, parent: ProgramState, fork: _PendingFork):
        self.parent = parent
        self._fork = fork
        self.branches = fork.branches

    def __getitem__(self, i: int) -> ProgramState:
        return self.branches[i]

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.branches)

    def __len__(self) -> int:
        return len(self.branches)

    def __iadd__(self, other: NodeLike) -> ForkGroup:
        for branch in self.branches:
            branch += other
        return self

    def join(self, mode: str = "gather") -> None:
        """Bring the branches' results back into the parent.

        "gather": every variable a branch wrote becomes, in the parent, the list of the
        branches' values (None where a branch did not write it). "concat": the branches' new
        text is appended to the parent's text, in branch order. Raises ForkError (with the
        failed branch indices) if a branch failed; the other branches have run to the end.
        """
        if mode not in ("gather", "concat"):
            raise InvalidRequest(f"join mode must be 'gather' or 'concat', got {mode!r}")
        parent = self.parent
        with parent._lock:
            lazy = self._fork in parent._pending
            if lazy:
                parent._pending.append(_PendingJoin(self._fork, mode))
                # What branches get after the join is not part of it: fix their nodes now.
                frozen = []
                for branch in self.branches:
                    with branch._lock:
                        frozen.append(branch._pending)
                        branch._pending = []
                self._fork.frozen = frozen
        if lazy:
            if parent._stream:
                parent._sync()
            return
        threads = [threading.Thread(target=b._sync_tree_quiet, daemon=True) for b in self.branches]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = {b._branch_index: str(b._error) for b in self.branches if b._error is not None}
        if failed:
            raise ForkError(failed)
        if mode == "concat":
            parent += "".join(self._new_text(b) for b in self.branches)
            return
        names = dict.fromkeys(n for b in self.branches for n in b._vars)
        with parent._lock:
            for name in names:
                parent._vars[name] = [b._vars.get(name) for b in self.branches]
                parent._meta[name] = [b._meta.get(name) for b in self.branches]

    @staticmethod
    def _new_text(branch: ProgramState) -> str:
        return branch._text[len(branch._fork_text or ""):]

