"""The stretch rule: which recorded nodes go to the backend together, as one /program request.

Appending to a program only records. What a line (a program, or one branch of a fork) has
recorded runs when Python needs a value:

- read: reading a line (a variable, its text) runs everything it recorded, as one stretch. A
  branch whose fork has not run yet first runs its parent: the parent's stretch carries the
  fork with every branch's recorded nodes. A branch whose fork has run starts its siblings'
  recorded nodes as well, so branches read one after the other run concurrently.
- join: while the fork is still recorded, the join is recorded after it and the branches'
  nodes so far are fixed into the fork (what a branch gets after the join is not joined).
  Once the fork has run, every branch's tree runs, and the join happens in the client.
- end: the end of a program runs its tree: the program, then each fork's branches.

ProgramState runs the stretches and Graph.stretches() lists a traced program's: both are Lines
driven by `read`, `join` and `finish` below, so the stretches a trace shows are the requests a
run makes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Line:
    """A program or one branch of a fork, as the rule sees it. Subclasses say what running a
    stretch means."""

    def __init__(self) -> None:
        self._recorded: list[Any] = []  # nodes and Forks, in program order, not yet run
        self._owner: Line | None = None  # the parent, until the stretch with this branch's fork ran
        self._siblings: list[Line] = []  # the branches of the fork that made this line
        self._forks: list[Fork] = []  # forks made from this line, in order
        self._lock = threading.Lock()  # guards `_recorded`; never held while a stretch runs

    def _record(self, item: Any) -> None:
        with self._lock:
            self._recorded.append(item)

    def _take(self) -> list[Any]:
        """Everything recorded, as one stretch; each fork in it takes its branches' nodes."""
        with self._lock:
            items, self._recorded = self._recorded, []
        _claim_forks(items)
        return items

    def _run_recorded(self) -> bool:
        """Take what this line recorded and run it, after its earlier stretches; wait for it.
        False if the line has failed."""
        raise NotImplementedError

    def _start_recorded(self) -> None:
        """Take what this line recorded and run it, without waiting."""
        self._run_recorded()

    def _run_each(self, fn: Callable[[Line], Any], lines: list[Line]) -> None:
        """fn(line) for every line."""
        for line in lines:
            fn(line)


class Fork:
    """A fork recorded in `parent`. `taken[i]` is what branch i ran with the parent's stretch."""

    def __init__(self, parent: Line, branches: list[Line], node: Any = None):
        self.parent = parent
        self.branches = branches
        self.node = node  # what the fork is to the caller (a graph node id), if anything
        self.frozen: list[list[Any]] | None = None  # the branches' nodes, fixed by a lazy join
        self.taken: list[list[Any]] | None = None
        for branch in branches:
            branch._owner, branch._siblings = parent, branches
        with parent._lock:
            parent._recorded.append(self)
            parent._forks.append(self)

    def claim(self) -> None:
        """The parent's stretch takes this fork: each branch's nodes go with it."""
        if self.frozen is not None:
            for nodes in self.frozen:
                _claim_forks(nodes)
            self.taken = self.frozen
        else:
            self.taken = [branch._take() for branch in self.branches]

    def done(self) -> None:
        """The parent's stretch has run (or never will): the branches go on on their own."""
        for branch in self.branches:
            branch._owner = None


def _claim_forks(items: list[Any]) -> None:
    for item in items:
        if isinstance(item, Fork):
            item.claim()


def read(line: Line) -> bool:
    """Python reads `line`: run what it recorded. False if the line has failed."""
    if line._owner is not None:
        read(line._owner)
    if line._recorded:
        for sibling in line._siblings:
            if sibling is not line and sibling._owner is None and sibling._recorded:
                sibling._start_recorded()
    return line._run_recorded()


def join(fork: Fork, node: Any) -> bool:
    """Join `fork`'s branches into its parent. True: `node` is recorded after the fork and runs
    with it. False: the fork has left with its parent's stretch, so every branch's tree runs
    now, and the caller joins their results."""
    parent = fork.parent
    with parent._lock:
        lazy = any(item is fork for item in parent._recorded)
        if lazy:
            parent._recorded.append(node)
            frozen = []
            for branch in fork.branches:
                with branch._lock:
                    frozen.append(branch._recorded)
                    branch._recorded = []
            fork.frozen = frozen
    if not lazy:
        parent._run_each(finish, fork.branches)
    return lazy


def finish(line: Line) -> bool:
    """The end of a program: run `line`, then (if it did not fail) each fork's branch trees."""
    if not read(line):
        return False
    for fork in list(line._forks):
        line._run_each(finish, fork.branches)
    return True
