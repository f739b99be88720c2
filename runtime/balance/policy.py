"""Which worker gets a request: round robin, shortest queue, or cache aware.

One `LoadBalancer` serves both the HTTP process of `radixflow serve --dp-size N` (workers are
the replica ranks 0..N-1, keys are token ids; server/data_parallel.py) and `radixflow router`
(workers are URLs, keys are prompt text; router/), with the knobs of a PolicyConfig
(config.py). A worker's load is its requests in flight: `select` counts one more on the
worker it picks, `done` one less when the request ends (whatever the outcome).

cache_aware is SGLang's router policy (sgl-router `cache_aware`):

1. If the load is imbalanced, max - min > balance_abs_threshold AND
   max > min * balance_rel_threshold, take the least-loaded worker.
2. Otherwise find each worker's longest prefix of the key in the approximate tree of the
   prompts sent to it. If the best match covers more than cache_threshold of the key, take
   that worker; else take the worker with the smallest tree (the most room for new prefixes).
3. Either way, record the key under the chosen worker.

Ties go to the less loaded worker, then the one picked fewer times, then the first listed
(SGLang leaves ties to map order). Trees larger than max_tree_size characters lose their
least recently used leaves every eviction_interval seconds.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable

from .config import PolicyConfig
from .prefix_tree import PrefixTree

Worker = Hashable


class NoWorker(LookupError):
    """Every worker is excluded or gone."""


class LoadBalancer:
    def __init__(self, workers: Iterable[Worker], config: PolicyConfig | None = None):
        self.config = config or PolicyConfig()
        self.workers: list[Worker] = []
        self.load: dict[Worker, int] = {}
        self.routed: dict[Worker, int] = {}  # requests sent, all time
        self.cache_routed: dict[Worker, int] = {}  # of those, sent for a prefix match
        self.tree = PrefixTree()
        self._next = 0  # round robin position
        self._last_eviction = time.monotonic()
        for worker in workers:
            self.add_worker(worker)

    @property
    def needs_key(self) -> bool:
        return self.config.method == "cache_aware"

    def add_worker(self, worker: Worker) -> None:
        if worker in self.load:
            return
        self.workers.append(worker)
        self.load[worker] = 0
        self.routed.setdefault(worker, 0)
        self.cache_routed.setdefault(worker, 0)
        self.tree.add_tenant(worker)

    def remove_worker(self, worker: Worker) -> None:
        if worker not in self.load:
            return
        self.workers.remove(worker)
        del self.load[worker]
        self.tree.remove_tenant(worker)

    # -- choosing --------------------------------------------------------------------------

    def select(self, key: str | None = None, exclude: Iterable[Worker] = ()) -> Worker:
        """The worker for a request whose prompt is `key`; counts it in that worker's load.
        Raises NoWorker when every worker is excluded."""
        excluded = set(exclude)
        candidates = [w for w in self.workers if w not in excluded]
        if not candidates:
            raise NoWorker("no worker is available")
        method = self.config.method
        if method == "round_robin":
            worker = self._round_robin(excluded)
        elif method == "shortest_queue":
            worker = self._least_loaded(candidates)
        else:
            worker = self._cache_aware(key or "", candidates)
        self.assign(worker)
        return worker

    def assign(self, worker: Worker) -> None:
        """Count a request on `worker` that was not chosen here (a session's own replica)."""
        self.load[worker] = self.load.get(worker, 0) + 1
        self.routed[worker] = self.routed.get(worker, 0) + 1

    def done(self, worker: Worker) -> None:
        """A request on `worker` ended (finished, aborted, failed or retried elsewhere)."""
        if self.load.get(worker, 0) > 0:
            self.load[worker] -= 1

    def _order(self, worker: Worker) -> tuple:
        return (self.load[worker], self.routed[worker], self.workers.index(worker))

    def _least_loaded(self, candidates: list[Worker]) -> Worker:
        return min(candidates, key=self._order)

    def _round_robin(self, excluded: set[Worker]) -> Worker:
        n = len(self.workers)
        for step in range(n):
            worker = self.workers[(self._next + step) % n]
            if worker not in excluded:
                self._next = (self._next + step + 1) % n
                return worker
        raise NoWorker("no worker is available")

    def imbalanced(self, candidates: list[Worker]) -> bool:
        loads = [self.load[w] for w in candidates]
        high, low = max(loads), min(loads)
        return (high - low > self.config.balance_abs_threshold
                and high > low * self.config.balance_rel_threshold)

    def _cache_aware(self, key: str, candidates: list[Worker]) -> Worker:
        self._maybe_evict()
        if self.imbalanced(candidates):
            worker = self._least_loaded(candidates)
        else:
            matches = self.tree.match(key) if key else {}
            best = max((matches.get(w, 0) for w in candidates), default=0)
            if key and best / len(key) > self.config.cache_threshold:
                worker = min((w for w in candidates if matches.get(w, 0) == best),
                             key=self._order)
                self.cache_routed[worker] += 1
            else:
                worker = min(candidates, key=lambda w: (self.tree.size(w), *self._order(w)))
        if key:
            self.tree.insert(key, worker)
        return worker

    def _maybe_evict(self) -> None:
        now = time.monotonic()
        if now - self._last_eviction >= self.config.eviction_interval:
            self._last_eviction = now
            self.tree.evict(self.config.max_tree_size)

    # -- state -----------------------------------------------------------------------------

    def clear_cache(self) -> None:
        """The workers' caches were flushed: forget the prompts sent to them."""
        self.tree.clear()

    def describe(self, worker: Worker) -> dict:
        """The policy's view of a worker (for /get_server_info, /workers, /metrics)."""
        return {"load": self.load.get(worker, 0), "routed_requests": self.routed.get(worker, 0),
                "cache_routed_requests": self.cache_routed.get(worker, 0),
                "tree_chars": self.tree.size(worker)}
