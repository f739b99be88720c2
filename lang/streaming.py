"""The text a streamed program produces, handed from the thread that runs it to its readers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator


class TextEvents:
    """(variable name or None, new text) pieces, in order, until `finish()`."""

    def __init__(self, *, finished: bool = False):
        self._events: list[tuple[str | None, str]] = []
        self._finished = finished
        self._cond = threading.Condition()

    def put(self, name: str | None, delta: str) -> None:
        with self._cond:
            self._events.append((name, delta))
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def follow(self, var_name: str | None, is_written: Callable[[str], bool]) -> Iterator[str]:
        """The pieces as they come: all of them, or only variable `var_name`'s, until it is
        written (`is_written(var_name)`) or the program ends."""
        seen = 0
        while True:
            with self._cond:
                while seen >= len(self._events) and not self._finished and not (
                        var_name is not None and is_written(var_name)):
                    self._cond.wait()
                batch, finished = self._events[seen:], self._finished
                seen += len(batch)
                var_done = var_name is not None and is_written(var_name)
            for name, delta in batch:
                if var_name is None or name == var_name:
                    yield delta
            if (finished or var_done) and seen >= len(self._events):
                return
