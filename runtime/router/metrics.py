"""The router's /metrics: per worker its load, requests routed, tree size and health;
retries and removed workers (Prometheus text format)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .router import Router

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def router_metrics(router: Router) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Collector(router))
    return generate_latest(registry)


class _Collector:
    def __init__(self, router: Router):
        self.router = router

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        router = self.router

        def family(kind: Any, name: str, doc: str, key: str) -> Any:
            f = kind(f"radixflow_router:{name}", doc, labels=["worker"])
            for url in router.balancer.workers:
                f.add_metric([url], router.balancer.describe(url)[key])
            return f

        yield family(GaugeMetricFamily, "worker_load", "Requests in flight.", "load")
        yield family(CounterMetricFamily, "worker_routed_requests",
                     "Requests routed to the worker.", "routed_requests")
        yield family(CounterMetricFamily, "worker_cache_routed_requests",
                     "Requests routed to the worker for its prefix match.",
                     "cache_routed_requests")
        yield family(GaugeMetricFamily, "worker_tree_chars",
                     "Prompt characters in the worker's routing tree.", "tree_chars")
        healthy = GaugeMetricFamily("radixflow_router:worker_healthy",
                                    "1 if the last health check passed.", labels=["worker"])
        for url, state in router.workers.items():
            healthy.add_metric([url], float(state.healthy))
        yield healthy
        yield CounterMetricFamily("radixflow_router:retries",
                                  "Requests sent again to another worker.", value=router.retries)
        yield GaugeMetricFamily("radixflow_router:workers_removed",
                                "Workers removed since start.", value=len(router.removed))
