"""Router: the workers, their health, the policy that picks one, and the HTTP client that
talks to them (proxy.py relays the requests)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import Request

from ..balance.policy import LoadBalancer, NoWorker
from .args import RouterArgs

logger = logging.getLogger(__name__)

# Request headers passed on to a worker (the body is passed as is); never the client's
# Authorization, Cookie or Proxy-Authorization: the router authenticates with its own key.
FORWARD_HEADERS = ("content-type", "accept")
# What /get_server_info and /workers show of a worker's own /get_server_info
WORKER_STATS = ("num_running", "num_waiting", "kv_used_tokens", "kv_total_tokens",
                "cache_hit_tokens", "prompt_tokens", "generation_tokens", "dp_size")


@dataclass
class WorkerState:
    url: str
    healthy: bool = True
    failures: int = 0  # failed health checks in a row
    last_error: str | None = None


@dataclass
class RemovedWorker:
    url: str
    reason: str
    time: float = field(default_factory=time.time)


class Router:
    """The workers, the policy and the HTTP client that talks to the workers."""

    def __init__(self, args: RouterArgs):
        self.args = args
        self.balancer = LoadBalancer(args.worker_urls, args.policy_config())
        self.workers: dict[str, WorkerState] = {u: WorkerState(u) for u in args.worker_urls}
        self.removed: list[RemovedWorker] = []
        self.retries = 0
        self.http: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task | None = None

    def headers(self, request: Request | None = None) -> dict[str, str]:
        """Headers for a worker: the client's content-type and accept (for a relayed
        request), and the router's own --worker-api-key."""
        headers = {} if request is None else {
            k: v for k, v in request.headers.items() if k.lower() in FORWARD_HEADERS}
        if self.args.worker_api_key:
            headers["authorization"] = f"Bearer {self.args.worker_api_key}"
        return headers

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=self.args.connect_timeout),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        if self.http is not None:
            await self.http.aclose()

    async def wait_workers(self, timeout: float) -> None:
        """Return once every worker answers /health; raise RuntimeError naming the ones that
        did not within `timeout` seconds, or that refuse the router's key."""
        deadline = time.monotonic() + timeout
        waiting = set(self.workers)
        while waiting:
            results = await asyncio.gather(*(self._healthy(url) for url in waiting))
            waiting = {url for url, ok in zip(waiting, results, strict=True) if not ok}
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker(s) not healthy after {timeout:.0f} s (--worker-startup-timeout): "
                    + ", ".join(f"{u} ({self.workers[u].last_error})" for u in sorted(waiting)))
            if waiting:
                await asyncio.sleep(0.5)
        await self._check_models()

    async def _check_models(self) -> None:
        """RuntimeError if a worker refuses the router's key; a warning if they serve
        different models."""
        assert self.http is not None
        models, refused = {}, []
        for url in self.workers:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                r = await self.http.get(url + "/get_model_info", headers=self.headers(),
                                        timeout=self.args.health_check_timeout)
                if r.status_code == 401:
                    refused.append(url)
                    continue
                models[url] = r.json().get("model_path")
        if refused:
            raise RuntimeError(
                f"worker(s) {', '.join(refused)} refused the router's key (401): start the "
                "router with --worker-api-key set to the workers' --api-key"
                + ("" if self.args.worker_api_key else " (none is set)"))
        if len(set(models.values())) > 1:
            logger.warning("the workers serve different models: %s", models)

    async def _healthy(self, url: str) -> bool:
        assert self.http is not None
        try:
            r = await self.http.get(url + "/health", headers=self.headers(),
                                    timeout=self.args.health_check_timeout)
        except httpx.HTTPError as exc:
            self.workers[url].last_error = f"{type(exc).__name__}: {exc}" if str(exc) else \
                type(exc).__name__
            return False
        if r.status_code != 200:
            self.workers[url].last_error = f"/health answered {r.status_code}"
            return False
        return True

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.args.health_check_interval)
            await self.check_health()

    async def check_health(self) -> None:
        urls = list(self.workers)
        results = await asyncio.gather(*(self._healthy(url) for url in urls))
        for url, ok in zip(urls, results, strict=True):
            state = self.workers.get(url)
            if state is None:
                continue
            state.healthy = ok
            state.failures = 0 if ok else state.failures + 1
            if state.failures >= self.args.health_failure_threshold:
                self.remove(url, f"{state.failures} failed health checks: {state.last_error}")

    # -- workers ---------------------------------------------------------------------------

    def add(self, url: str) -> None:
        url = url.rstrip("/")
        self.workers.setdefault(url, WorkerState(url))
        self.balancer.add_worker(url)
        self.removed = [r for r in self.removed if r.url != url]

    def remove(self, url: str, reason: str) -> None:
        if self.workers.pop(url, None) is None:
            return
        self.balancer.remove_worker(url)
        self.removed.append(RemovedWorker(url, reason))
        logger.warning("worker %s removed: %s", url, reason)

    def mark_unhealthy(self, url: str) -> None:
        if url in self.workers:
            self.workers[url].healthy = False

    def pick(self, key: str | None, keyed: bool, tried: set[str], *,
             only: str | None = None) -> str:
        """The next worker to try: healthy ones first (the policy's choice when `keyed`);
        `only` that one, once. Raises NoWorker when every worker was tried."""
        if only is not None:
            if only in tried or only not in self.workers:
                raise NoWorker(f"worker {only} is gone")
            if keyed:
                self.balancer.assign(only)
            return only
        unhealthy = {u for u, s in self.workers.items() if not s.healthy}
        for exclude in (tried | unhealthy, tried):
            if keyed:
                with contextlib.suppress(NoWorker):
                    return self.balancer.select(key, exclude=exclude)
            else:
                for url in self.balancer.workers:
                    if url not in exclude:
                        return url
        raise NoWorker("no worker is available")

    async def flush_caches(self) -> list[tuple[str, int, str]]:
        """Flush every worker's cache; (url, status, answer) of those that failed. The
        routing trees are cleared once every worker flushed."""
        assert self.http is not None
        http = self.http

        async def flush(url: str) -> tuple[str, int, str]:
            try:
                r = await http.post(url + "/flush_cache", headers=self.headers())
                return url, r.status_code, r.text
            except httpx.HTTPError as exc:
                return url, 502, f"{type(exc).__name__}: {exc}"

        results = await asyncio.gather(*(flush(u) for u in list(self.workers)))
        failed = [(u, code, text.strip()) for u, code, text in results if code != 200]
        if not failed:
            self.balancer.clear_cache()
        return failed

    # -- info ------------------------------------------------------------------------------

    async def worker_info(self, url: str) -> dict:
        info: dict[str, Any] = {"url": url, "healthy": self.workers[url].healthy,
                                **self.balancer.describe(url)}
        assert self.http is not None
        try:
            r = await self.http.get(url + "/get_server_info", headers=self.headers(),
                                    timeout=self.args.health_check_timeout)
            r.raise_for_status()
            server = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            info["info_error"] = f"{type(exc).__name__}: {exc}"
            return info
        info.update({name: server[name] for name in WORKER_STATS if name in server})
        if server.get("prompt_tokens"):
            info["cache_hit_rate"] = server["cache_hit_tokens"] / server["prompt_tokens"]
        if "replicas" in server:
            info["replicas"] = server["replicas"]
        return info

    async def workers_info(self) -> list[dict]:
        return list(await asyncio.gather(*(self.worker_info(u) for u in list(self.workers))))
