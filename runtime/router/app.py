"""`radixflow router`: one HTTP endpoint in front of several `radixflow serve` workers.

Each generation request (/generate, /v1/completions, /v1/chat/completions, streamed or not)
goes to the worker the policy picks (policy.py; keys are the prompt's text, token ids as
characters, or a chat's messages) and its response is relayed byte for byte. A request that
had not started, because the worker refused the connection or answered 503 before any byte
came back, is retried on another worker; a refused connection, or
--health-failure-threshold failed health checks in a row, removes the worker. Once bytes
have been relayed, a failure ends the response (a stream gets an error event): it is not
retried, since the client has seen part of an answer.

The router's own routes: /health (200 while a worker is left), /get_server_info and /workers
(each worker's load, requests routed, routing tree size, and its own scheduler stats and
cache hit rate), /list_workers, /add_worker, /remove_worker, /flush_cache (every worker),
/metrics (the router's). /get_model_info, /model_info, /v1/models, /version and
/health_generate are answered by a worker.

Keys (RouterAuthMiddleware): --api-key is the clients' (every route but /health and the
management ones); /add_worker, /remove_worker and /flush_cache need --admin-api-key and are
refused when it is not set, so nobody can point the router at a worker of their own and
receive the clients' prompts. The client's Authorization (and cookies, and any header but
content-type and accept) never reaches a worker: the router sends the workers its own
--worker-api-key, on requests and health checks alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from ..balance.policy import LoadBalancer, NoWorker
from ..balance.prefix_tree import token_key
from .args import RouterArgs, check_worker_url

logger = logging.getLogger(__name__)

VERSION = "0.1.0"
SSE = "text/event-stream"
# Request headers passed on to a worker (the body is passed as is); never the client's
# Authorization, Cookie or Proxy-Authorization: the router authenticates with its own key.
FORWARD_HEADERS = ("content-type", "accept")
# Routes that change the set of workers or act on all of them: --admin-api-key only.
ADMIN_PATHS = frozenset({"/add_worker", "/remove_worker", "/flush_cache"})
OPEN_PATHS = frozenset({"/health"})
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CLIENT_CLOSED = 499  # nginx's status for a client that closed the connection first


def _json_error(status: int, message: str) -> Response:
    body = {"object": "error", "message": message, "type": "router_error", "code": status}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


class ClientGone(Exception):
    pass


async def until_disconnect(work: Awaitable[Any], request: Request) -> Any:
    """Await `work`; if the client hangs up first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


async def _close(resp: httpx.Response) -> None:
    """Close the worker's response even while our task is being cancelled (client gone):
    the closed connection is what tells the worker to abort."""
    with anyio.CancelScope(shield=True):
        await resp.aclose()


def routing_key(path: str, body: Any) -> str | None:
    """The part of a request that decides cache-aware routing: its prompt, as characters.
    A batch goes where its first prompt goes."""
    if not isinstance(body, dict):
        return None

    def first(value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            return value[0]
        return value

    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<{m.get('role')}>{content if isinstance(content, str) else ''}\n")
        return "".join(parts)
    prompt = first(body.get("prompt") if path == "/v1/completions" else body.get("text"))
    if path == "/generate" and prompt is None:
        prompt = first(body.get("input_ids"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < 0x110000
                                        for t in prompt):
        return token_key(prompt)
    return None


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
        did not within `timeout` seconds."""
        assert self.http is not None
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

    # -- proxying --------------------------------------------------------------------------

    def _pick(self, key: str | None, keyed: bool, tried: set[str]) -> str:
        """The next worker to try: healthy ones first (the policy's choice when `keyed`)."""
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

    async def forward(self, request: Request, path: str, *, keyed: bool) -> Response:
        """Send the request to a worker (chosen by the policy when `keyed`: those count in
        the workers' loads), retrying elsewhere while no byte of an answer has come back;
        relay the answer."""
        assert self.http is not None
        body = await request.body()
        key = None
        if keyed and self.balancer.needs_key:
            try:
                key = routing_key(path, orjson.loads(body))
            except orjson.JSONDecodeError:
                key = None  # the worker answers the 400
        headers = self.headers(request)
        tried: set[str] = set()
        last_error = "no worker is available"
        while True:
            try:
                url = self._pick(key, keyed, tried)
            except NoWorker:
                return _json_error(503, f"no worker could take the request: {last_error}")
            tried.add(url)

            def release(url: str = url) -> None:
                if keyed:
                    self.balancer.done(url)

            upstream = self.http.build_request(request.method, url + path, content=body,
                                               headers=headers, params=request.query_params)
            try:
                resp = await until_disconnect(self.http.send(upstream, stream=True), request)
            except ClientGone:  # the send is cancelled: the worker sees its client go
                release()
                return Response(status_code=CLIENT_CLOSED)
            except httpx.ConnectError as exc:  # nothing listens: the worker is gone
                release()
                last_error = f"{url}: {type(exc).__name__}: {exc}"
                self.remove(url, f"connection failed: {exc}")
                self.retries += 1
                continue
            except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                release()
                last_error = f"{url}: {type(exc).__name__}"
                if url in self.workers:
                    self.workers[url].healthy = False
                self.retries += 1
                continue
            except httpx.HTTPError as exc:  # sent, then failed: it may have started
                release()
                return _json_error(502, f"worker {url} failed: {type(exc).__name__}: {exc}")
            if resp.status_code == 503:  # refused before it started (unhealthy, stopping)
                text = (await resp.aread()).decode(errors="replace")
                await resp.aclose()
                release()
                last_error = f"{url} answered 503: {text[:300]}"
                if url in self.workers:
                    self.workers[url].healthy = False
                self.retries += 1
                continue
            if resp.status_code == 401:  # the worker's key, not the client's: say so
                await resp.aread()
                await resp.aclose()
                release()
                logger.error("worker %s refused the router's --worker-api-key (401)", url)
                return _json_error(502, f"worker {url} refused the router's key: the router's "
                                        "--worker-api-key must be the workers' --api-key")
            return await self._relay(resp, url, release)

    async def _relay(self, resp: httpx.Response, url: str, release: Any) -> Response:
        media_type = resp.headers.get("content-type")
        if not (media_type or "").startswith(SSE):
            try:
                content = await resp.aread()
            except httpx.HTTPError as exc:
                return _json_error(502, f"worker {url} failed mid-answer: {exc}")
            finally:
                release()
                await _close(resp)
            return Response(content, status_code=resp.status_code, media_type=media_type)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            except httpx.HTTPError as exc:
                error = {"error": {"message": f"worker {url} failed mid-stream: {exc}",
                                   "type": "router_error", "code": 502}}
                yield b"data: " + orjson.dumps(error) + b"\n\n"
            finally:
                release()
                await _close(resp)  # the client left, or the stream ended: free the worker

        return StreamingResponse(relay(), status_code=resp.status_code, media_type=media_type)

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
        for name in ("num_running", "num_waiting", "kv_used_tokens", "kv_total_tokens",
                     "cache_hit_tokens", "prompt_tokens", "generation_tokens", "dp_size"):
            if name in server:
                info[name] = server[name]
        if server.get("prompt_tokens"):
            info["cache_hit_rate"] = server["cache_hit_tokens"] / server["prompt_tokens"]
        if "replicas" in server:
            info["replicas"] = server["replicas"]
        return info

    async def workers_info(self) -> list[dict]:
        return list(await asyncio.gather(*(self.worker_info(u) for u in list(self.workers))))

    def metrics(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        registry = CollectorRegistry()
        router = self

        class Collector:
            def collect(self):
                def family(kind, name, doc, key):
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
                                            "1 if the last health check passed.",
                                            labels=["worker"])
                for url, state in router.workers.items():
                    healthy.add_metric([url], float(state.healthy))
                yield healthy
                yield CounterMetricFamily("radixflow_router:retries",
                                          "Requests sent again to another worker.",
                                          value=router.retries)
                yield GaugeMetricFamily("radixflow_router:workers_removed",
                                        "Workers removed since start.",
                                        value=len(router.removed))

        registry.register(Collector())
        return generate_latest(registry)


class RouterAuthMiddleware:
    """/health is open; ADMIN_PATHS need `Authorization: Bearer <--admin-api-key>` (403 when
    none is set); the rest `Bearer <--api-key>` when one is set. (The server's
    ApiKeyMiddleware, with a second key for the management routes.)"""

    def __init__(self, app: Any, api_key: str | None, admin_api_key: str | None):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.admin = f"Bearer {admin_api_key}".encode() if admin_api_key else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if path.rstrip("/") in ADMIN_PATHS or "/" + path.lstrip("/") in ADMIN_PATHS:
            if self.admin is None:
                error = _json_error(403, f"{path} is disabled: start the router with "
                                         "--admin-api-key KEY and send 'Authorization: Bearer "
                                         "KEY' to manage its workers")
                return await error(scope, receive, send)
            if not hmac.compare_digest(given, self.admin):
                error = _json_error(401, f"{path} needs the router's admin key: send the "
                                         "header 'Authorization: Bearer <--admin-api-key>'")
                return await error(scope, receive, send)
        elif self.expected is not None and not hmac.compare_digest(given, self.expected):
            return await _json_error(401, "missing or incorrect API key: send the header "
                                          "'Authorization: Bearer <key>'")(scope, receive, send)
        return await self.app(scope, receive, send)


def create_app(router: Router) -> FastAPI:
    app = FastAPI(title="radixflow router", version=VERSION, docs_url=None, redoc_url=None)
    app.state.router = router
    app.add_middleware(RouterAuthMiddleware, api_key=router.args.api_key,
                       admin_api_key=router.args.admin_api_key)

    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        async def generate(request: Request, path: str = path) -> Response:
            return await router.forward(request, path, keyed=True)

        app.add_api_route(path, generate, methods=["POST"])

    for path in ("/get_model_info", "/model_info", "/v1/models", "/version",
                 "/health_generate"):
        async def passthrough(request: Request, path: str = path) -> Response:
            return await router.forward(request, path, keyed=False)

        app.add_api_route(path, passthrough, methods=["GET"])

    @app.get("/health")
    async def health() -> Response:
        if not router.workers:
            return _json_error(503, "no worker is left")
        return Response(status_code=200)

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> Response:
        info = {"router": True, "version": VERSION, "policy": vars(router.balancer.config),
                "workers": await router.workers_info(), "retries": router.retries,
                "removed_workers": [vars(r) for r in router.removed]}
        return Response(orjson.dumps(info), media_type="application/json")

    @app.get("/workers")
    async def workers() -> Response:
        return Response(orjson.dumps({"workers": await router.workers_info(),
                                      "removed_workers": [vars(r) for r in router.removed]}),
                        media_type="application/json")

    @app.get("/list_workers")
    async def list_workers() -> Response:
        return Response(orjson.dumps({"urls": list(router.balancer.workers)}),
                        media_type="application/json")

    @app.post("/add_worker")
    async def add_worker(url: str) -> Response:
        try:
            url = check_worker_url(url)
        except ValueError as exc:
            return _json_error(400, str(exc))
        router.add(url)
        logger.info("worker %s added with /add_worker", url)
        return Response(orjson.dumps({"added": url}), media_type="application/json")

    @app.post("/remove_worker")
    async def remove_worker(url: str) -> Response:
        url = url.rstrip("/")
        if url not in router.workers:
            return _json_error(404, f"no worker {url}")
        router.remove(url, "removed with /remove_worker")
        return Response(orjson.dumps({"removed": url}), media_type="application/json")

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        assert router.http is not None
        urls = list(router.workers)

        async def flush(url: str) -> tuple[str, int, str]:
            try:
                r = await router.http.post(url + "/flush_cache", headers=router.headers())
                return url, r.status_code, r.text
            except httpx.HTTPError as exc:
                return url, 502, f"{type(exc).__name__}: {exc}"

        results = await asyncio.gather(*(flush(u) for u in urls))
        failed = [(u, code, text.strip()) for u, code, text in results if code != 200]
        if failed:
            return _json_error(max(code for _, code, _ in failed), "cache not flushed on "
                               + "; ".join(f"{u} ({code}: {text})" for u, code, text in failed))
        router.balancer.clear_cache()
        return Response(f"Cache flushed on {len(urls)} workers.\n", media_type="text/plain")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(router.metrics(), media_type=METRICS_TYPE)

    return app


def run_router(args: RouterArgs) -> int:
    """Wait for the workers, then serve until SIGINT/SIGTERM. Returns the exit code."""
    import uvicorn
    import uvloop

    from ..processes import setup_logging, stop_on_sigterm

    setup_logging(args.log_level)
    stop_on_sigterm()
    router = Router(args)
    code = 0
    serving = False

    async def main() -> None:
        nonlocal code, serving
        await router.start()
        try:
            await router.wait_workers(args.worker_startup_timeout)
        except RuntimeError as exc:
            logger.error("%s", exc)
            code = 1
            await router.close()
            return
        server = uvicorn.Server(uvicorn.Config(
            create_app(router), host=args.host, port=args.port, log_level=args.log_level,
            access_log=False, timeout_graceful_shutdown=3, timeout_keep_alive=30))
        try:
            task = asyncio.create_task(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.05)
            if server.started:
                serving = True
                print(f"radixflow router is serving at http://{args.host}:{args.port} in front "
                      f"of {len(args.worker_urls)} workers ({args.load_balance_method})",
                      file=sys.stderr, flush=True)
            await task
        finally:
            await router.close()
        if not server.started:
            code = 1

    try:
        uvloop.run(main())
    except KeyboardInterrupt:  # after serving: uvicorn's clean shutdown; before: interrupted
        if not serving:
            return 130
    return code
