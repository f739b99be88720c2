"""Tracing: run a program function on a recording state to build its graph, with no model.

Arguments not given to `trace` become placeholder strings; reading a variable returns a
placeholder too. Placeholders survive concatenation and f-strings, so a text node knows which
arguments and variables it contains (dynamic text) and the graph gets variable edges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from radixflow.runtime.program.wire import MAX_BRANCHES

from .errors import InvalidRequest, TraceError
from .graph import Graph
from .ir import Gen, NodeLike, RoleBegin, RoleEnd, Select, Text, flatten
from .placeholder import Placeholder, markers, show_markers

MAX_TRACE_NODES = 2000


class StopTrace(BaseException):
    """Ends a stop-at-model trace at the first model node (BaseException: user code that
    catches Exception around `s += ...` must not swallow it)."""


class TraceState:
    """Records what a program appends; same surface as ProgramState."""

    def __init__(self, graph: Graph, branch: str = "main", *, stop_at_model: bool = False,
                 _parent: TraceState | None = None, _after: int | None = None):
        self.graph = graph
        self.branch = branch
        self.stop_at_model = stop_at_model
        self._last: int | None = _after
        self._writers: dict[str, int] = dict(_parent._writers) if _parent else {}
        self._open_role: str | None = _parent._open_role if _parent else None
        self._fork_from = _after if _parent else None  # a branch's first node hangs off its fork

    def _add(self, kind: str, label: str, **data: Any) -> int:
        if len(self.graph.nodes) >= MAX_TRACE_NODES:
            raise TraceError(
                f"the program added more than {MAX_TRACE_NODES} nodes while tracing; it probably "
                f"loops on a generated value (placeholders never end a loop): pass concrete "
                f"arguments or bound the loop")
        if self.stop_at_model and kind in ("gen", "select", "read", "fork"):
            raise StopTrace()
        node_id = self.graph.add_node(kind, label, self.branch, **data)
        prev = self._last
        if prev is not None:
            self.graph.add_edge(prev, node_id, "fork" if prev == self._fork_from else "next")
        self._last = node_id
        return node_id

    def __iadd__(self, other: NodeLike) -> TraceState:
        for node in flatten(other):
            self._add_node(node)
        return self

    def _add_node(self, node: Any) -> None:
        match node:
            case Text(text=text):
                marks = markers(text)
                node_id = self._add("text", show_markers(text), text=text,
                                    args=[n for k, n in marks if k == "arg"],
                                    vars=[n for k, n in marks if k == "var"],
                                    dynamic=bool(marks))
                for kind, name in marks:
                    if kind == "var" and name in self._writers:
                        self.graph.add_edge(self._writers[name], node_id, "var", label=name)
            case Gen():
                options = {k: v for k, v in vars(node.params).items() if v not in (None, ())}
                if node.regex:
                    options["regex"] = node.regex
                if node.json_schema:
                    options["json_schema"] = "..."
                opts = ", ".join(f"{k}={v!r}" for k, v in options.items())
                node_id = self._add("gen", f"gen {node.name or '_'}({opts})", name=node.name,
                                    regex=node.regex, json_schema=node.json_schema,
                                    params=options, in_role=self._open_role)
                self._write(node.name, node_id)
            case Select(name=name, choices=choices, method=method):
                node_id = self._add("select", f"select {name or '_'} {list(choices)!r}",
                                    name=name, choices=list(choices), method=method)
                self._write(name, node_id)
            case RoleBegin(role=role):
                if self._open_role is not None:
                    raise InvalidRequest(f"cannot open a {role!r} turn inside {self._open_role!r}")
                self._open_role = role
                self._add("role_begin", f"<{role}>", role=role)
            case RoleEnd(role=role):
                if self._open_role != role:
                    raise InvalidRequest(
                        f"cannot close {role!r}: the open turn is {self._open_role!r}")
                self._open_role = None
                self._add("role_end", f"</{role}>", role=role)
            case _:
                raise InvalidRequest(f"cannot add {type(node).__name__} to a program")

    def _write(self, name: str | None, node_id: int) -> None:
        if name is not None:
            self._writers[name] = node_id

    def _read(self, what: str, name: str) -> Placeholder:
        label = f"read {name}" if what == "var" else f"read {what}()"
        node_id = self._add("read", label, name=name)
        if what == "var" and name in self._writers:
            self.graph.add_edge(self._writers[name], node_id, "var", label=name)
        return Placeholder(what, name)

    def __getitem__(self, name: str) -> Placeholder:
        return self._read("var", name)

    def get_var(self, name: str, default: Any = None) -> Placeholder:
        return self._read("var", name)

    def text(self) -> Placeholder:
        return self._read("text", "text")

    def messages(self) -> list:
        self._read("messages", "messages")
        return []

    @contextlib.contextmanager
    def _role(self, role: str) -> Iterator[TraceState]:
        self += RoleBegin(role)
        yield self
        self += RoleEnd(role)

    def system(self):
        return self._role("system")

    def user(self):
        return self._role("user")

    def assistant(self):
        return self._role("assistant")

    def fork(self, n: int) -> TraceForkGroup:
        if not isinstance(n, int) or not 1 <= n <= MAX_BRANCHES:
            raise InvalidRequest(f"fork needs 1..{MAX_BRANCHES} branches, got {n!r}")
        fork_id = self._add("fork", f"fork {n}", n=n)
        branches = [TraceState(self.graph, f"{self.branch}.{i}", stop_at_model=self.stop_at_model,
                               _parent=self, _after=fork_id) for i in range(n)]
        self.graph.forks[fork_id] = [b.branch for b in branches]
        return TraceForkGroup(self, fork_id, branches)


class TraceForkGroup:
    def __init__(self, parent: TraceState, fork_id: int, branches: list[TraceState]):
        self.parent = parent
        self.fork_id = fork_id
        self.branches = branches

    def __getitem__(self, i: int) -> TraceState:
        return self.branches[i]

    def __iter__(self) -> Iterator[TraceState]:
        return iter(self.branches)

    def __len__(self) -> int:
        return len(self.branches)

    def __iadd__(self, other: NodeLike) -> TraceForkGroup:
        for branch in self.branches:
            branch += other
        return self

    def join(self, mode: str = "gather") -> None:
        join_id = self.parent._add("join", f"join ({mode})", mode=mode, fork=self.fork_id)
        for branch in self.branches:
            self.parent.graph.add_edge(branch._last, join_id, "join")
            for name, writer in branch._writers.items():
                if self.parent._writers.get(name) != writer:
                    self.parent._writers[name] = join_id
