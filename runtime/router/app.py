"""`radixflow router`: the HTTP app (create_app) and its process (run_router).

Each generation request (/generate, /v1/completions, /v1/chat/completions, streamed or not)
goes to the worker the policy picks (runtime/balance/; keys are the prompt's text, token ids
as characters, or a chat's messages: routing_key.py) and its response is relayed byte for
byte (proxy.py). A request that had not started, because the worker refused the connection
or answered 503 before any byte came back, is retried on another worker; a refused
connection, or --health-failure-threshold failed health checks in a row, removes the worker
(router.py). Once bytes have been relayed, a failure ends the response (a stream gets an
error event): it is not retried, since the client has seen part of an answer.

The router's own routes: /health (200 while a worker is left), /get_server_info and /workers
(each worker's load, requests routed, routing tree size, and its own scheduler stats and
cache hit rate), /list_workers, /add_worker, /remove_worker, /flush_cache (every worker),
/metrics (the router's: metrics.py). /get_model_info, /model_info, /v1/models[/{id}], /version and
/health_generate are answered by a worker. The other APIs (Anthropic's messages, OpenAI's
responses and embeddings, /encode, /tokenizer_info) are relayed by api_routes.py.

Keys (auth.py): --api-key is the clients' (every route but /health and the management
ones); /add_worker, /remove_worker and /flush_cache need --admin-api-key and are refused when
it is not set, so nobody can point the router at a worker of their own and receive the
clients' prompts. The client's Authorization (and cookies, and any header but content-type
and accept) never reaches a worker: the router sends the workers its own --worker-api-key,
on requests and health checks alike.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.responses import Response

from ..server.responses import OrjsonResponse
from .api_routes import add_api_routes
from .args import RouterArgs, check_worker_url
from .auth import RouterAuthMiddleware
from .errors import router_error
from .metrics import CONTENT_TYPE, router_metrics
from .proxy import forward
from .router import Router

logger = logging.getLogger(__name__)

VERSION = "0.1.0"


def create_app(router: Router) -> FastAPI:
    app = FastAPI(title="radixflow router", version=VERSION, docs_url=None, redoc_url=None)
    app.state.router = router
    app.add_middleware(RouterAuthMiddleware, api_key=router.args.api_key,
                       admin_api_key=router.args.admin_api_key)

    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        async def generate(request: Request, path: str = path) -> Response:
            return await forward(router, request, path, keyed=True)

        app.add_api_route(path, generate, methods=["POST"])

    for path in ("/get_model_info", "/model_info", "/v1/models", "/version",
                 "/health_generate"):
        async def passthrough(request: Request, path: str = path) -> Response:
            return await forward(router, request, path, keyed=False)

        app.add_api_route(path, passthrough, methods=["GET"])

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> Response:
        # quoted whole, dots too: "../flush_cache" stays one segment of /v1/models/ upstream
        segment = quote(model_id, safe="").replace(".", "%2E")
        return await forward(router, request, "/v1/models/" + segment, keyed=False)

    add_api_routes(app, router)

    @app.get("/health")
    async def health() -> Response:
        if not router.workers:
            return router_error(503, "no worker is left")
        return Response(status_code=200)

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> Response:
        info = {"router": True, "version": VERSION, "policy": vars(router.balancer.config),
                "workers": await router.workers_info(), "retries": router.retries,
                "removed_workers": [vars(r) for r in router.removed]}
        return OrjsonResponse(info)

    @app.get("/workers")
    async def workers() -> Response:
        return OrjsonResponse({"workers": await router.workers_info(),
                               "removed_workers": [vars(r) for r in router.removed]})

    @app.get("/list_workers")
    async def list_workers() -> Response:
        return OrjsonResponse({"urls": list(router.balancer.workers)})

    @app.post("/add_worker")
    async def add_worker(url: str) -> Response:
        try:
            url = check_worker_url(url)
        except ValueError as exc:
            return router_error(400, str(exc))
        router.add(url)
        logger.info("worker %s added with /add_worker", url)
        return OrjsonResponse({"added": url})

    @app.post("/remove_worker")
    async def remove_worker(url: str) -> Response:
        url = url.rstrip("/")
        if url not in router.workers:
            return router_error(404, f"no worker {url}")
        router.remove(url, "removed with /remove_worker")
        return OrjsonResponse({"removed": url})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        count = len(router.workers)
        failed = await router.flush_caches()
        if failed:
            return router_error(max(code for _, code, _ in failed), "cache not flushed on "
                                + "; ".join(f"{u} ({code}: {text})" for u, code, text in failed))
        return Response(f"Cache flushed on {count} workers.\n", media_type="text/plain")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(router_metrics(router), media_type=CONTENT_TYPE)

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
