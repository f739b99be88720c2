"""ProgramState: what a program function appends to, and the lazy interpreter behind it.

`s += ...` only records nodes, compiled at once to /program wire nodes (compile.py). Recorded
nodes run as straight-line stretches, one /program request each, when Python needs a value
(stretch.py has the rule); a stretch's response is then folded into the state. Forks and
joins are in fork.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from radixflow.runtime.program import ProgramExecutor, chat
from radixflow.runtime.program.wire import MAX_BRANCHES, has_model_node

from . import stretch
from .chat_template import chat_template_of
from .compile import WireCompiler
from .errors import InvalidRequest, VariableNotFound, error_from_wire
from .fork import ForkGroup, fail_forks, fold_branches
from .ir import NodeLike, RoleBegin, RoleEnd, flatten
from .params import DEFAULT_PARAMS, NO_LOGPROBS, GenParams, LogprobDefaults
from .streaming import TextEvents


def _no_generate(body: dict) -> dict:  # text-only stretches never call the model
    raise AssertionError("a text-only stretch called the model")


class ProgramState(stretch.Line):
    """The state of one running program: its text, variables, meta info and chat messages.

    Read with `s["name"]`, `s.text()`, `s.messages()`, `s.get_meta_info(name)`,
    `s.scores(name)`; stream with `s.text_iter(name)`. Reading a variable that no gen/select
    produced raises VariableNotFound; reading from a program or branch that failed raises its
    error (ProgramError / BranchError carry the index).
    """

    def __init__(self, backend: Any, *, defaults: GenParams = DEFAULT_PARAMS, stream: bool = False,
                 logprobs: LogprobDefaults = NO_LOGPROBS,
                 _branch_of: ProgramState | None = None):
        super().__init__()
        self.backend = backend
        self._compiler = (_branch_of._compiler.branch() if _branch_of is not None
                          else WireCompiler(chat_template_of(backend), defaults, logprobs))
        self._stream = stream
        self._text: str = ""
        self._fork_text = ""  # a branch's text where its fork happened
        self._vars: dict[str, Any] = {}
        self._meta: dict[str, Any] = {}
        self._messages: list[dict] = []
        self._error: BaseException | None = None
        self._queue: deque[list[Any]] = deque()  # stretches taken, in order, not yet run
        self._queue_lock = threading.Lock()
        self._exec_lock = threading.Lock()  # one stretch of this state runs at a time
        # A branch's text streams through its parent's run: its own text_iter ends at once.
        self._events = TextEvents(finished=_branch_of is not None or not stream)
        self._thread: threading.Thread | None = None  # runs a streamed program
        self.num_stretches = 0  # requests this state sent (for tests and curiosity)
        self.index: int | None = None  # its place in run_batch

    # ---- building ----

    def __iadd__(self, other: NodeLike) -> ProgramState:
        for node in flatten(other):
            self._record(self._compiler.compile(node))
        if self._stream:
            self._sync()
        return self

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
        if not isinstance(n, int) or not 1 <= n <= MAX_BRANCHES:
            raise InvalidRequest(f"fork needs 1..{MAX_BRANCHES} branches, got {n!r}")
        branches = [ProgramState(self.backend, stream=self._stream, _branch_of=self)
                    for _ in range(n)]
        group = ForkGroup(self, stretch.Fork(self, branches))
        if self._stream:
            self._sync()
        return group

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
        return chat.closed_messages(self._messages)

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
        return dict(zip(meta["choices"], meta["scores"], strict=True))

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped this program or branch, or None."""
        return self._error

    @property
    def ok(self) -> bool:
        return self._error is None

    def sync(self) -> ProgramState:
        """Wait until the program (and, in stream mode, its thread) has finished; raise its
        error."""
        if self._thread is not None:
            self._thread.join()
        self._run_to_end()
        return self

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Text as it is generated (stream=True): all of it, or only variable `var_name`.

        Without streaming, yields the final text (or the variable's value) once.
        """
        if not self._stream:
            yield self.text() if var_name is None else str(self[var_name])
            return
        yield from self._events.follow(var_name, lambda name: name in self._vars)
        if self._error is not None:
            raise self._error

    async def text_aiter(self, var_name: str | None = None) -> AsyncIterator[str]:
        """`text_iter` for asyncio code: `async for piece in state.text_aiter(): ...`."""
        pieces = self.text_iter(var_name)
        done = object()
        while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
            yield piece

    def __repr__(self) -> str:
        status = "failed" if self._error else ("pending" if self._recorded else "done")
        return f"ProgramState({status}, variables={list(self._vars)})"

    # ---- running (stretch.py calls run_recorded, start_recorded and run_each) ----

    def _sync(self) -> None:
        """Run what this state recorded (a read); raise its error if it failed."""
        if not stretch.read(self):
            raise self._error

    def _run_to_end(self) -> None:
        """Run this state and every branch forked from it; raise its error if it failed."""
        if not stretch.finish(self):
            raise self._error

    def _finish(self, error: BaseException | None = None) -> None:
        """End of a streamed program: keep its error, wake text_iter readers."""
        if error is not None and self._error is None:
            self._error = error
        self._events.finish()

    def _run_recorded(self) -> bool:
        self._queue_recorded()
        self._run_queue()
        return self._error is None

    def _start_recorded(self) -> None:
        self._queue_recorded()
        threading.Thread(target=self._run_queue, daemon=True).start()

    def _run_each(self, fn: Callable[[stretch.Line], Any], lines: list[stretch.Line]) -> None:
        """fn(line) for every line at once (branches may wait on each other's batching)."""
        threads = [threading.Thread(target=fn, args=(line,), daemon=True) for line in lines[1:]]
        for thread in threads:
            thread.start()
        fn(lines[0])
        for thread in threads:
            thread.join()

    def _queue_recorded(self) -> None:
        with self._queue_lock:  # a stretch is queued as it is taken: reads keep their order
            items = self._take()
            if items:
                self._queue.append(items)

    def _run_queue(self) -> None:
        with self._exec_lock:
            while True:
                with self._queue_lock:
                    if not self._queue:
                        return
                    items = self._queue.popleft()
                self._run(items)

    def _run(self, items: list[Any]) -> None:
        """Send one stretch and fold its response in; an error stays on the state."""
        if self._error is not None:
            self._fail(self._error, items)
            return
        nodes = [self._to_wire(item) for item in items]
        program = {"text": self._text, "nodes": nodes}
        stream_kw = {"stream": True, "on_text": self._events.put} if self._stream else {}
        try:
            if has_model_node(nodes):
                if getattr(self.backend, "needs_messages", False):
                    program["messages"] = [dict(m) for m in self._messages]
                self.num_stretches += 1
                result = self.backend.run_program(program, **stream_kw)
            else:
                result = ProgramExecutor(_no_generate, keep_exceptions=True,
                                         on_text=stream_kw.get("on_text")).run(program)
        except Exception as exc:
            self._fail(exc, items)
            return
        self._fold(items, nodes, result)

    def _to_wire(self, item: Any) -> dict:
        if isinstance(item, stretch.Fork):
            return {"type": "fork",
                    "branches": [[self._to_wire(i) for i in taken] for taken in item.taken]}
        return item

    def _fold(self, items: list[Any], nodes: list[dict], result: dict) -> None:
        """Fold a /program response into this state (and its forked branches)."""
        text = self._text
        branch_results = iter(result.get("branches") or [])
        for item, node, piece in zip(items, nodes, result["pieces"], strict=False):
            chat.add_piece(self._messages, node, piece)
            if isinstance(item, stretch.Fork):
                fold_branches(item, node, text, self._messages, next(branch_results))
            text += piece
        with self._lock:
            self._text = text
            self._vars.update(result["variables"])
            self._meta.update(result["meta_info"])
        error = result.get("error")
        if error is not None:
            fail_forks(items[len(result["pieces"]):], "its parent failed before the fork")
            self._fail(error.get("exception") or error_from_wire(error))

    def _fail(self, error: BaseException, items: Sequence[Any] = ()) -> None:
        """Stop this state with `error`; the forks in `items` will never run."""
        if self._error is None:
            self._error = error
        fail_forks(items, f"{type(error).__name__}: {error}")

    def _start_branch(self, text: str, messages: list[dict]) -> None:
        """This branch's fork ran after `text`: it continues from there."""
        self._text = self._fork_text = text
        self._messages = [dict(m) for m in messages]
