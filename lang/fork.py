"""Forks: `s.fork(n)` gives a ForkGroup of n branch states; `join` brings them back.

A fork is recorded in its parent like any node (stretch.py says when it runs). When the
parent's stretch has run, each branch's result is folded into its branch state; a fork that
never runs fails its branches with BranchError.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import stretch
from .compile import join_node
from .errors import BranchError, ForkError
from .ir import NodeLike

if TYPE_CHECKING:
    from .state import ProgramState


class ForkGroup:
    """The branches of `s.fork(n)`: index or iterate them; `forks += x` adds x to every branch."""

    def __init__(self, parent: ProgramState, fork: stretch.Fork):
        self.parent = parent
        self._fork = fork
        self.branches: list[ProgramState] = fork.branches  # type: ignore[assignment]

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
        parent = self.parent
        if stretch.join(self._fork, join_node(mode)):  # runs with the fork, on the backend
            if parent._stream:
                parent._sync()
            return
        failed = {i: str(b.error) for i, b in enumerate(self.branches) if b.error is not None}
        if failed:
            raise ForkError(failed)
        if mode == "concat":
            parent += "".join(b._text[len(b._fork_text):] for b in self.branches)
            return
        names = dict.fromkeys(n for b in self.branches for n in b._vars)
        with parent._lock:
            for name in names:
                parent._vars[name] = [b._vars.get(name) for b in self.branches]
                parent._meta[name] = [b._meta.get(name) for b in self.branches]


def fold_branches(fork: stretch.Fork, node: dict, text: str, messages: list[dict],
                  results: list[dict]) -> None:
    """The parent's stretch ran `fork` (wire node `node`) after `text`: fold each branch's
    result into its branch state."""
    for i, (branch, result) in enumerate(zip(fork.branches, results, strict=True)):
        branch._start_branch(text, messages)
        branch._fold(fork.taken[i], node["branches"][i], result)
        if branch.error is not None:
            error = BranchError(f"fork branch {i} failed: {branch.error}", index=i)
            error.__cause__ = branch.error
            branch._error = error
    fork.done()  # NOTE: only now may a reader of a branch skip waiting for the parent


def fail_forks(items: Iterable[Any], why: str) -> None:
    """The forks among `items` will never run: their branches (and theirs) fail."""
    for item in items:
        if not isinstance(item, stretch.Fork):
            continue
        for i, branch in enumerate(item.branches):
            branch._error = BranchError(f"fork branch {i} did not run: {why}", index=i)
            fail_forks(item.taken[i], why)
        item.done()
