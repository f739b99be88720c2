"""The /dashboard's charts: throughput, TTFT and TPOT over the last minutes, in a ring of
fixed time buckets, fed by what the HTTP process sees (Metrics.request_finished, and the
scheduler's cumulative token counters sampled at each finish and each dashboard poll).

A bucket's tokens are the scheduler's counters' growth while it was current (so a long
stream's tokens land when they are made, as often as something samples them); its TTFT and
TPOT are the means over the requests that finished in it. Everything runs on the event loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BUCKET_S = 5.0
NUM_BUCKETS = 60  # five minutes


@dataclass
class Bucket:
    start: float
    requests: int = 0
    generation_tokens: int = 0
    prompt_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    tpot_sum: float = 0.0
    tpot_count: int = 0


class DashboardHistory:
    def __init__(self, stats: Callable[[], Any] | None = None, *, bucket_s: float = BUCKET_S,
                 num_buckets: int = NUM_BUCKETS, clock: Callable[[], float] = time.time):
        self.stats = stats  # () -> SchedulerStats | None: the replicas' summed counters
        self.bucket_s = bucket_s
        self.num_buckets = num_buckets
        self.clock = clock
        self.buckets: deque[Bucket] = deque(maxlen=num_buckets)
        self._last_counters: tuple[int, int] | None = None

    def _current(self) -> Bucket:
        start = self.clock() // self.bucket_s * self.bucket_s
        if not self.buckets or self.buckets[-1].start < start:
            self.buckets.append(Bucket(start))
        return self.buckets[-1]

    def sample(self) -> None:
        """Credit the scheduler's token counters' growth since the last sample to now."""
        stats = self.stats() if self.stats is not None else None
        if stats is None:
            return
        counters = (stats.generation_tokens, stats.prompt_tokens)
        last, self._last_counters = self._last_counters, counters
        if last is None:
            return
        bucket = self._current()
        bucket.generation_tokens += max(0, counters[0] - last[0])  # (a restart: from zero)
        bucket.prompt_tokens += max(0, counters[1] - last[1])

    def request_finished(self, ttft: float | None, tpot: float | None) -> None:
        self.sample()
        bucket = self._current()
        bucket.requests += 1
        if ttft is not None:
            bucket.ttft_sum += ttft
            bucket.ttft_count += 1
        if tpot is not None:
            bucket.tpot_sum += tpot
            bucket.tpot_count += 1

    def series(self) -> dict:
        """One point per bucket of the last num_buckets (empty ones included), oldest first."""
        self.sample()
        end = self._current().start
        by_start = {b.start: b for b in self.buckets}
        points = []
        for i in range(self.num_buckets - 1, -1, -1):
            start = end - i * self.bucket_s
            b = by_start.get(start) or Bucket(start)
            points.append({
                "t": start, "requests": b.requests,
                "generation_tokens_per_s": b.generation_tokens / self.bucket_s,
                "prompt_tokens_per_s": b.prompt_tokens / self.bucket_s,
                "ttft_ms": 1000 * b.ttft_sum / b.ttft_count if b.ttft_count else None,
                "tpot_ms": 1000 * b.tpot_sum / b.tpot_count if b.tpot_count else None,
            })
        return {"bucket_s": self.bucket_s, "points": points}
