"""Compiled grammars cached by key, compiled on worker threads under a deadline.

A hit costs no compile; concurrent requests for one key share one compile; errors are cached
too, so a bad grammar sent again is rejected at once. A key's `check` (the constraint's
validation) runs on the worker before its compile, never on the caller's thread.

xgrammar cannot cancel a compile. One still running `SLOW_COMPILE_S` after it started (or at
its deadline, if sooner) stops counting against `max_workers`: its thread is handed off and a
fresh one serves the queue, so slow compiles cannot starve the others (most compiles take
milliseconds). A handed-off compile may still finish within its deadline and serve its
requests; past the deadline its key fails fast, and the thread exits when the compile ends.
At most `max_abandoned` such threads run at once; while that many do, a key not seen before
is refused at once with a GrammarError (status 503: retry later), and cached keys still hit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from ..errors import GrammarError

logger = logging.getLogger(__name__)

# A compile running this long no longer holds one of the max_workers threads.
SLOW_COMPILE_S = 1.0


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
            raise _timeout_error(self._timeout) from None


def wait_any(pending: list[PendingGrammar], timeout: float) -> None:
    """Block until one of `pending` is done (compiled, failed, or past its deadline), or for
    `timeout` seconds at most."""
    if not pending:
        return
    now = time.monotonic()
    timeout = min([timeout] + [max(0.0, p._deadline - now) for p in pending])
    wait_futures([p._future for p in pending], timeout=timeout, return_when=FIRST_COMPLETED)


def _timeout_error(timeout: float) -> GrammarError:
    return GrammarError(f"grammar compilation took longer than {timeout:g}s; simplify the "
                        "constraint")


def busy_error(why: str) -> GrammarError:
    """A refusal for now, not a verdict on the constraint: status 503, never cached."""
    error = GrammarError(f"the server is busy compiling other grammars ({why}); retry later")
    error.status_code = 503
    return error


@dataclass(eq=False)
class _Worker:
    abandoned: bool = False  # slow: no longer counted, exits when its job ends


@dataclass(eq=False)
class _Job:
    key: Hashable
    check: Callable[[], None] | None
    future: Future
    deadline: float
    worker: _Worker | None = None
    started: float = field(default=0.0)

    @property
    def handoff_at(self) -> float:
        """When its thread stops counting against max_workers (it started running)."""
        return min(self.deadline, self.started + SLOW_COMPILE_S)


class CompileCache:
    def __init__(self, compile_fn: Callable[[Hashable], object], *, timeout: float,
                 max_workers: int = 2, max_abandoned: int | None = None,
                 max_entries: int = 512, max_bytes: int = 512 * 1024 * 1024,
                 size_fn: Callable[[object], int] = lambda value: 0):
        self._compile_fn = compile_fn
        self._size_fn = size_fn
        self.timeout = timeout
        self.max_workers = max_workers
        self.max_abandoned = 2 * max_workers if max_abandoned is None else max_abandoned
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._entries: OrderedDict[Hashable, tuple[Future, float]] = OrderedDict()
        self._sizes: dict[Hashable, int] = {}
        self._queue: deque[_Job] = deque()
        self._running: set[_Job] = set()
        self._workers = 0  # counted worker threads alive
        self._spawned = 0
        self.num_abandoned = 0  # threads handed off, still running a slow compile
        self._closed = False
        self._watchdog: threading.Thread | None = None
        self.num_compiles = 0  # compiles started, past their check (a cache hit adds none)
        self.num_hits = 0

    def submit(self, key: Hashable,
               check: Callable[[], None] | None = None) -> PendingGrammar:
        """The compile for `key`, started unless cached. `check` runs on the worker before a
        new compile only (a GrammarError it raises is cached like a compile error): a hit
        costs neither. Raises GrammarError (503) when abandoned compiles fill their cap."""
        with self._lock:
            hit = self._hit(key)
            if hit is not None:
                return hit
            if self._closed:
                raise busy_error("shutting down")
            if self.num_abandoned >= self.max_abandoned:
                raise busy_error(f"{self.num_abandoned} slow compiles are running")
            future: Future = Future()
            deadline = time.monotonic() + self.timeout
            self._entries[key] = (future, deadline)
            self._queue.append(_Job(key, check, future, deadline))
            self._evict()
            self._dispatch()
            self._cond.notify_all()
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
        with self._lock:
            self._closed = True
            queued, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for job in queued:
            job.future.cancel()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_threads(self) -> int:
        """Compile threads alive: counted workers plus abandoned ones."""
        return self._workers + self.num_abandoned

    # ---- threads (the lock held where noted) ----

    def _dispatch(self) -> None:
        """Start workers for the queue, up to max_workers counted ones (lock held)."""
        busy = sum(1 for job in self._running if not job.worker.abandoned)
        idle = self._workers - busy
        want = min(len(self._queue) - idle, self.max_workers - self._workers)
        for _ in range(max(0, want)):
            self._workers += 1
            self._spawned += 1
            threading.Thread(target=self._work, args=(_Worker(),), daemon=True,
                             name=f"grammar-compile-{self._spawned}").start()
        if self._watchdog is None and self._queue:
            self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                              name="grammar-compile-watchdog")
            self._watchdog.start()

    def _work(self, me: _Worker) -> None:
        while True:
            with self._lock:
                if me.abandoned:
                    self.num_abandoned -= 1
                    self._cond.notify_all()  # the watchdog may hand off another
                    return
                if self._closed or not self._queue:
                    self._workers -= 1
                    return
                job = self._queue.popleft()
                job.worker, job.started = me, time.monotonic()
                self._running.add(job)
                self._cond.notify_all()  # the watchdog: a new deadline to watch
            self._run(job)

    def _run(self, job: _Job) -> None:
        try:
            if job.check is not None:
                job.check()
            with self._lock:
                self.num_compiles += 1
            value = self._compile_fn(job.key)  # GrammarError propagates into the future
        except BaseException as exc:
            with self._lock:
                self._running.discard(job)
                self._cond.notify_all()
            job.future.set_exception(exc)
            return
        elapsed = time.monotonic() - job.started
        if elapsed > self.timeout:
            logger.warning("grammar compile finished after %.1fs, past its %.1fs deadline",
                           elapsed, self.timeout)
        with self._lock:
            self._running.discard(job)
            self._cond.notify_all()
            entry = self._entries.get(job.key)
            if entry is not None and entry[0] is job.future:
                try:
                    self._sizes[job.key] = self._size_fn(value)
                except Exception:  # the future must still be set, and the thread go on
                    logger.exception("grammar size unknown; counting it as 0 bytes")
                self._evict()
        job.future.set_result(value)

    def _watch(self) -> None:
        """Hands off the threads of compiles past their deadline, and fails queued jobs past
        theirs (their keys are forgotten, so a later request tries again)."""
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                expired = []
                for job in sorted(self._running, key=lambda j: j.handoff_at):
                    if (job.handoff_at <= now and not job.worker.abandoned
                            and self.num_abandoned < self.max_abandoned):
                        job.worker.abandoned = True
                        self._workers -= 1
                        self.num_abandoned += 1
                        logger.warning("a grammar compile runs past %.1fs: its thread is "
                                       "handed off (%d such)", now - job.started,
                                       self.num_abandoned)
                while self._queue and any(j.deadline <= now for j in self._queue):
                    job = next(j for j in self._queue if j.deadline <= now)
                    self._queue.remove(job)
                    entry = self._entries.get(job.key)
                    if entry is not None and entry[0] is job.future:
                        del self._entries[job.key]
                    expired.append(job)
                self._dispatch()
                # (a compile past its deadline that the cap keeps counted waits for a notify)
                deadlines = [j.deadline for j in self._queue] + [
                    j.handoff_at for j in self._running
                    if not j.worker.abandoned and j.handoff_at > now]
                if expired:
                    self._lock.release()
                    try:
                        for job in expired:
                            job.future.set_exception(busy_error(
                                f"no compile thread was free within {self.timeout:g}s"))
                    finally:
                        self._lock.acquire()
                    continue
                self._cond.wait(None if not deadlines else max(0.0, min(deadlines) - now)
                                + 0.001)

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
