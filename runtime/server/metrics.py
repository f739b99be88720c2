"""Prometheus metrics: per-request latencies observed here, scheduler gauges from its stats."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..messages import SchedulerStats
from .dashboard_history import DashboardHistory

disable_created_metrics()  # the *_created samples only add noise to every scrape

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class _SchedulerCollector(Collector):
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats | None]):
        self.model_name = model_name
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats()
        if s is None:
            return

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"radixflow:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"radixflow:{name}", doc, labels=["model_name"])
            c.add_metric([self.model_name], value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("kv_cache_usage", "Fraction of KV pool slots in use (0..1).",
                    s.kv_used_tokens / s.kv_total_tokens if s.kv_total_tokens else 0.0)
        yield gauge("kv_used_tokens", "KV pool slots in use.", s.kv_used_tokens)
        yield gauge("kv_total_tokens", "KV pool size in token slots.", s.kv_total_tokens)
        yield gauge("cache_hit_rate", "Prompt tokens served from the radix cache / prompt tokens.",
                    s.cache_hit_tokens / s.prompt_tokens if s.prompt_tokens else 0.0)
        yield counter("prompt_tokens", "Prompt tokens processed.", s.prompt_tokens)
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens)
        yield counter("cached_prompt_tokens", "Prompt tokens served from the radix cache.",
                      s.cache_hit_tokens)
        passes, drafted, accepted = (s.spec_verify_passes, s.spec_draft_tokens,
                                     s.spec_accepted_tokens)
        yield counter("spec_verify_passes", "Speculative verify passes (one per request "
                      "verified).", passes)
        yield counter("spec_draft_tokens", "Tokens drafted for speculative decoding.", drafted)
        yield counter("spec_accepted_tokens", "Drafted tokens the verify passes accepted.",
                      accepted)
        yield gauge("spec_accept_rate", "Drafted tokens accepted / drafted tokens (0: none "
                    "drafted).", accepted / drafted if drafted else 0.0)
        yield gauge("spec_accept_length", "Tokens a speculative verify pass makes per request "
                    "on average: 1 + accepted / passes (1: none).",
                    1 + accepted / passes if passes else 1.0)


class _ReplicaCollector(Collector):
    """Per scheduler replica (--dp-size; one row, rank 0, otherwise): load and cache use."""

    def __init__(self, model_name: str, replicas: Callable[[], list[dict]]):
        self.model_name = model_name
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        rows = self.replicas()
        if not rows:
            return
        labels = ["model_name", "dp_rank"]
        specs = [  # (name, doc, key, kind)
            ("replica_load", "Requests in flight on the replica.", "load", GaugeMetricFamily),
            ("replica_num_requests_running", "Requests in the replica's running batch.",
             "num_running", GaugeMetricFamily),
            ("replica_num_requests_waiting", "Requests waiting in the replica's queue.",
             "num_waiting", GaugeMetricFamily),
            ("replica_cache_hit_rate", "Prompt tokens the replica served from its radix cache "
             "/ its prompt tokens.", "cache_hit_rate", GaugeMetricFamily),
            ("replica_routed_requests", "Requests routed to the replica.", "routed_requests",
             CounterMetricFamily),
            ("replica_prompt_tokens", "Prompt tokens the replica processed.", "prompt_tokens",
             CounterMetricFamily),
            ("replica_cached_prompt_tokens", "Prompt tokens the replica served from its radix "
             "cache.", "cache_hit_tokens", CounterMetricFamily),
        ]
        for name, doc, key, kind in specs:
            family = kind(f"radixflow:{name}", doc, labels=labels)
            for row in rows:
                if key in row:
                    family.add_metric([self.model_name, str(row["dp_rank"])], row[key])
            yield family


class Metrics:
    def __init__(self, model_name: str, stats: Callable[[], SchedulerStats | None],
                 replicas: Callable[[], list[dict]] | None = None):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.requests = Counter("radixflow:requests", "Requests submitted to the scheduler.",
                                labels, registry=self.registry).labels(model_name)
        self.aborted = Counter("radixflow:requests_aborted", "Requests aborted (client gone).",
                               labels, registry=self.registry).labels(model_name)
        self.finished = Counter("radixflow:requests_finished", "Requests that finished.",
                                labels, registry=self.registry).labels(model_name)
        self.ttft = Histogram("radixflow:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_LATENCY_BUCKETS,
                              registry=self.registry).labels(model_name)
        self.tpot = Histogram("radixflow:time_per_output_token_seconds",
                              "Mean time per output token after the first.", labels,
                              buckets=_TPOT_BUCKETS, registry=self.registry).labels(model_name)
        self.e2e = Histogram("radixflow:e2e_request_latency_seconds", "End-to-end latency.",
                             labels, buckets=_LATENCY_BUCKETS,
                             registry=self.registry).labels(model_name)
        self.registry.register(_SchedulerCollector(model_name, stats))
        self.history = DashboardHistory(stats)  # the /dashboard's charts
        if replicas is not None:
            self.registry.register(_ReplicaCollector(model_name, replicas))

    def requests_started(self, n: int) -> None:
        self.requests.inc(n)

    def request_aborted(self) -> None:
        self.aborted.inc()

    def request_finished(self, created: float, first_token: float | None, now: float,
                         completion_tokens: int) -> None:
        self.finished.inc()
        self.e2e.observe(now - created)
        ttft = tpot = None
        if first_token is not None:
            self.ttft.observe(ttft := first_token - created)
            if completion_tokens > 1:
                self.tpot.observe(tpot := (now - first_token) / (completion_tokens - 1))
        self.history.request_finished(ttft, tpot)

    def render(self) -> bytes:
        return generate_latest(self.registry)
