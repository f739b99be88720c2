"""Compiled grammars cached by key, compiled on worker threads under a deadline.

A hit costs no compile; concurrent requests for one key share one compile; errors are cached
too, so a bad grammar sent again is rejected at once. xgrammar cannot cancel a compile: one
that misses its deadline keeps its thread until it ends, and its key fails fast meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures

from ..errors import GrammarError

logger = logging.getLogger(__name__)


class PendingGrammar:
    """A compile in flight (or done). Poll `done()`; `result()` blocks until the deadline."""

    def __init__(self, key: Hashable, future: Future, deadline: float, timeout: float):
        self.key = key
        self._future = future
        self._deadline = deadline
        self._timeout = timeout

    def done(self) -> bool:
        return self._future.done() or time.monotonic() >= self._deadline

    def result(self):
        """The compiled grammar; raises GrammarError on a compile error or a missed deadline."""
        try:
            return self._future.result(timeout=max(0.0, self._deadline - time.monotonic()))
        except FutureTimeout:
            raise GrammarError(
                f"grammar compilation took longer than {self._timeout:g}s; simplify the "
                "constraint") from None


def wait_any(pending: list[PendingGrammar], timeout: float) -> None:
    """Block until one of `pending` is done (compiled, failed, or past its deadline), or for
    `timeout` seconds at most."""
    if not pending:
        return
    now = time.monotonic()
    timeout = min([timeout] + [max(0.0, p._deadline - now) for p in pending])
    wait_futures([p._future for p in pending], timeout=timeout, return_when=FIRST_COMPLETED)


class CompileCache:
    def __init__(self, compile_fn: Callable[[Hashable], object], *, timeout: float,
                 max_workers: int = 2, max_entries: int = 512,
                 max_bytes: int = 512 * 1024 * 1024,
                 size_fn: Callable[[object], int] = lambda value: 0):
        self._compile_fn = compile_fn
        self._size_fn = size_fn
        self.timeout = timeout
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Future, float]] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self.num_compiles = 0  # compiles started (a cache hit adds none)
        self.num_hits = 0

    def submit(self, key: Hashable,
               check: Callable[[], None] | None = None) -> PendingGrammar:
        """The compile for `key`, started unless cached. `check` runs before a new compile
        only: a key is cached once it has passed it, so a hit costs neither."""
        with self._lock:
            hit = self._hit(key)
        if hit is not None:
            return hit
        if check is not None:
            check()
        with self._lock:
            hit = self._hit(key)
            if hit is not None:
                return hit
            future = self._executor.submit(self._run, key)
            deadline = time.monotonic() + self.timeout
            self._entries[key] = (future, deadline)
            self.num_compiles += 1
            self._evict()
        return PendingGrammar(key, future, deadline, self.timeout)

    def _hit(self, key: Hashable) -> PendingGrammar | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        self.num_hits += 1
        return PendingGrammar(key, entry[0], entry[1], self.timeout)

    def get(self, key: Hashable):
        return self.submit(key).result()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._sizes.clear()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __len__(self) -> int:
        return len(self._entries)

    def _run(self, key: Hashable):
        start = time.monotonic()
        value = self._compile_fn(key)  # GrammarError propagates into the future, cached
        elapsed = time.monotonic() - start
        if elapsed > self.timeout:
            logger.warning("grammar compile finished after %.1fs, past its %.1fs deadline",
                           elapsed, self.timeout)
        with self._lock:
            if key in self._entries:
                self._sizes[key] = self._size_fn(value)
                self._evict()
        return value

    def _evict(self) -> None:
        """Drop least recently used finished entries beyond the count or byte budget."""
        total = sum(self._sizes.values())
        for key in list(self._entries):
            if len(self._entries) <= self.max_entries and total <= self.max_bytes:
                return
            future, _ = self._entries[key]
            if not future.done():
                continue
            del self._entries[key]
            total -= self._sizes.pop(key, 0)
