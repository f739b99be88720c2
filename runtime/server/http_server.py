"""The FastAPI app: native SGLang-compatible routes, /metrics, auth, and the one error handler."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ContextTooLong, InvalidRequest, RadixflowError, ServerUnavailable
from ..native_api import ParsedGenerate, ResponseBuilder, parse_generate
from ..server_args import ServerArgs
from .metrics import CONTENT_TYPE, Metrics
from .tokenizer_manager import RequestGroup, TokenizerManager

logger = logging.getLogger(__name__)

VERSION = "0.1.0"


class OrjsonResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_body(status: int, message: str, *, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape (a superset of SGLang's `{"error": {"message": ...}}`)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, **kw: Any) -> OrjsonResponse:
    return OrjsonResponse(error_body(status, message, **kw), status_code=status)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    pass


async def until_disconnect(work: Awaitable[Any], request: Request) -> Any:
    """Await `work`; if the client hangs up first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


async def open_stream(tm: TokenizerManager, group: RequestGroup, request: Request,
                      content: AsyncIterator[bytes]) -> Response:
    """The SSE response for `group`, once its first outputs are in.

    Status 200 cannot be taken back once sent, so a request the scheduler rejects at once
    (an invalid grammar) still gets its 400 here rather than an aborted stream.
    """
    try:
        first = await until_disconnect(group.peek(), request)
        for _, out in first:
            finish = out.token.finish
            error = rejection(finish.to_json() if finish is not None else None)
            if error is not None:
                raise error
    except ClientGone:
        tm.release(group)
        return Response(status_code=499)
    except BaseException:
        tm.release(group)
        raise
    return GroupStreamingResponse(content, tm, group)


class GroupStreamingResponse(StreamingResponse):
    """A stream that releases (aborts) its request group however the response ends."""

    def __init__(self, content: AsyncIterator[bytes], tm: TokenizerManager, group: RequestGroup):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.tm, self.group = tm, group

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.tm.release(self.group)


async def collect(group: RequestGroup, builders: list[ResponseBuilder]) -> None:
    while not group.done:
        for index, out in await group.next():
            builders[index].add(out)


async def respond(tm: TokenizerManager, group: RequestGroup, builders: list[ResponseBuilder],
                  request: Request, *, stream: bool, stream_body: Any,
                  result: Any) -> Response:
    """The response for a submitted group: SSE when `stream`, else the JSON from
    `result(builders)` once every request finished (499 if the client left first)."""
    if stream:
        return await open_stream(tm, group, request, stream_body)
    try:
        await until_disconnect(collect(group, builders), request)
    except ClientGone:
        return Response(status_code=499)
    finally:
        tm.release(group)
    raise_if_rejected(builders)
    return OrjsonResponse(result(builders))


def rejection(finish_reason: dict | None) -> RadixflowError | None:
    """The error for a request the scheduler aborted: a 400 for a bad request (grammar, too
    long), a 500 for a failure inside. Client-initiated aborts never get here: their
    response is gone."""
    if finish_reason is None or finish_reason["type"] != "abort":
        return None
    message = finish_reason.get("message") or "the request was aborted"
    if (finish_reason.get("status_code") or 400) >= 500:
        return RadixflowError(message)
    return InvalidRequest(message)


def raise_if_rejected(builders: list[ResponseBuilder]) -> None:
    for b in builders:
        error = rejection(b.finish_reason)
        if error is not None:
            raise error


async def native_stream(group: RequestGroup, builders: list[ResponseBuilder]
                        ) -> AsyncIterator[bytes]:
    try:
        while not group.done:
            touched: dict[int, None] = {}
            for index, out in await group.next():
                builders[index].add(out)
                touched[index] = None
            # One event per request per step, however many outputs queued up meanwhile.
            for index in touched:
                yield sse(builders[index].event())
    except ServerUnavailable as exc:
        yield sse(error_body(503, str(exc)))
    yield SSE_DONE


class ApiKeyMiddleware:
    """Every path but /health needs `Authorization: Bearer <key>`."""

    OPEN_PATHS = frozenset({"/health"})

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            response = error_response(401, "missing or incorrect API key: send the header "
                                           "'Authorization: Bearer <key>'",
                                      code="invalid_api_key")
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RadixflowError)
    async def _radixflow_error(request: Request, exc: RadixflowError) -> Response:
        status = exc.status_code
        if status >= 500:
            logger.error("%s %s failed: %s", request.method, request.url.path, exc)
        code = "context_length_exceeded" if isinstance(exc, ContextTooLong) else None
        return error_response(status, str(exc), param=getattr(exc, "param", None), code=code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return validation_error_response(exc.errors())

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("%s %s raised", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


def validation_error_response(errors: list[dict]) -> OrjsonResponse:
    """400 naming the first bad field of a pydantic validation failure."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return error_response(400, message, param=param)


def server_info(args: ServerArgs, tm: TokenizerManager, processes: dict[str, int]) -> dict:
    info = {k: v for k, v in dataclasses.asdict(args).items() if k != "api_key"}
    info["api_key_set"] = args.api_key is not None
    info.update(model_info=tm.model_info, version=VERSION, healthy=tm.is_healthy,
                failure=tm.failure, processes=processes)
    s = tm.stats
    if s is not None:
        info.update(num_running=s.num_running, num_waiting=s.num_waiting,
                    kv_used_tokens=s.kv_used_tokens, kv_total_tokens=s.kv_total_tokens,
                    cache_hit_tokens=s.cache_hit_tokens, prompt_tokens=s.prompt_tokens,
                    generation_tokens=s.generation_tokens, stats_time=tm.stats_time)
    info["num_pending_requests"] = len(tm.states)
    return info


def create_app(args: ServerArgs, tm: TokenizerManager, metrics: Metrics | None = None,
               *, served_model_name: str, processes: dict[str, int] | None = None) -> FastAPI:
    """The whole HTTP surface; `tm` must be started on the loop that serves the app.

    `processes` (name -> pid of the server's processes) is shown in /get_server_info.
    """
    from .openai_api import create_openai_router

    app = FastAPI(title="radixflow", version=VERSION, docs_url=None, redoc_url=None)
    _install_error_handlers(app)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    app.include_router(create_openai_router(tm, served_model_name))
    app.state.tm = tm

    async def generate_native(body: Any, request: Request) -> Response:
        parsed = parse_generate(body, tm.tokenizer, tm.context_length, vocab_size=tm.vocab_size)
        group = tm.submit(parsed.reqs)
        builders = parsed.builders(tm.tokenizer)
        return await respond(
            tm, group, builders, request, stream=parsed.stream,
            stream_body=native_stream(group, builders) if parsed.stream else None,
            result=lambda bs: parsed.response([b.result() for b in bs]))

    async def generate_json(body: dict) -> Any:
        """/generate for in-process callers (the /program executor): the response object."""
        if isinstance(body, dict):
            body = {**body, "stream": False}
        parsed: ParsedGenerate = parse_generate(body, tm.tokenizer, tm.context_length,
                                                vocab_size=tm.vocab_size)
        builders = parsed.builders(tm.tokenizer)
        async with tm.submit(parsed.reqs) as group:
            await collect(group, builders)
        raise_if_rejected(builders)
        return parsed.response([b.result() for b in builders])

    @app.get("/health")
    async def health() -> Response:
        if not tm.is_healthy:
            return error_response(503, tm.failure or "unhealthy")
        return Response(status_code=200)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        await asyncio.wait_for(generate_json(body), timeout=60)
        return Response(status_code=200)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> Response:
        info = dict(tm.model_info)
        info.setdefault("tokenizer_path", args.tokenizer or info.get("model_path"))
        tok = tm.tokenizer
        info.update(is_generation=True, served_model_name=served_model_name,
                    chat_template=getattr(tok, "chat_template", None),
                    bos_token=getattr(tok, "bos_token", None),
                    eos_token=getattr(tok, "eos_token", None))
        return OrjsonResponse(info)

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def get_server_info() -> Response:
        return OrjsonResponse(server_info(args, tm, processes or {}))

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        if not await tm.flush_cache():
            return error_response(400, "cache not flushed: requests are still running; "
                                       "retry when the server is idle")
        return PlainTextResponse("Cache flushed.\n")

    @app.post("/concate_and_append_request")
    async def concate_and_append_request() -> Response:
        # The next /generate carries the joined text anyway (protocol doc, section 8.2).
        return OrjsonResponse({"success": True})

    @app.post("/generate")
    async def generate(request: Request) -> Response:
        return await generate_native(await read_json(request), request)

    # NOTE: a program thread blocks while its generations run, so the pool must allow as many
    # programs as the scheduler can batch (asyncio's default pool has cpu_count + 4 threads).
    program_pool = ThreadPoolExecutor(max(args.max_running_requests, 8),
                                      thread_name_prefix="program")

    @app.post("/program")
    async def program(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidRequest("the program must be a JSON object")
        try:
            from radixflow.program import execute_program
        except ImportError:
            return error_response(501, "/program is not available in this build")
        loop = asyncio.get_running_loop()

        def generate_sync(gen_body: dict) -> dict:
            return asyncio.run_coroutine_threadsafe(generate_json(gen_body), loop).result()

        result = await loop.run_in_executor(program_pool, execute_program, body, generate_sync)
        return OrjsonResponse(result)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        if metrics is None:
            return error_response(404, "metrics are disabled")
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    app.state.started = time.time()
    return app
