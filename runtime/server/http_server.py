"""The FastAPI app: the native and OpenAI routers, auth, and the one error handler.

A request's path: route handler (native_routes, openai_api) -> request building (native_api,
openai_requests) -> SchedulerClient.submit -> respond (JSON or SSE, via response_builder's
ResponseBuilder and openai_responses).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..errors import ContextTooLong, RadixflowError
from ..server_args import ServerArgs
from . import (
    anthropic_routes,
    dashboard_routes,
    embedding_routes,
    native_routes,
    openai_api,
    responses_routes,
    tokenize_routes,
)
from .auth import ApiKeyMiddleware
from .door import DoorMiddleware
from .metrics import Metrics
from .responses import error_response, validation_error
from .scheduler_client import SchedulerClient
from .state import ServerState
from .tool_parsers import ToolParser, choose_parser

logger = logging.getLogger(__name__)


def create_app(args: ServerArgs, client: SchedulerClient, metrics: Metrics | None = None,
               *, served_model_name: str, processes: dict[str, int] | None = None) -> FastAPI:
    """The whole HTTP surface; `client` must be started on the loop that serves the app.

    `processes` (name -> pid of the server's processes) is shown in /get_server_info.
    """
    app = FastAPI(title="radixflow", version=native_routes.VERSION, docs_url=None,
                  redoc_url=None)
    app.state.server = ServerState(args=args, client=client, served_model_name=served_model_name,
                                   metrics=metrics, processes=processes or {},
                                   tool_parser=_tool_parser(args, client))
    for exc_type, handler in ERROR_HANDLERS.items():
        app.add_exception_handler(exc_type, handler)
    client.max_queued_requests = args.max_queued_requests
    client.max_stream_buffer_bytes = args.max_stream_buffer_bytes
    # The last added runs first: the API key is checked before the body is looked at.
    app.add_middleware(DoorMiddleware, max_request_bytes=args.max_request_bytes)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    app.include_router(openai_api.router)
    app.include_router(native_routes.router)
    app.include_router(tokenize_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(embedding_routes.router)
    app.include_router(dashboard_routes.router)
    return app


def _tool_parser(args: ServerArgs, client: SchedulerClient) -> ToolParser:
    template = getattr(client.tokenizer, "chat_template", None)
    parser, why = choose_parser(template if isinstance(template, str) else None,
                                args.tool_call_parser)
    logger.info("tool calls: the %s format (%s)", parser.name, why)
    stop_ids = list(client.model_info.get("eos_token_ids") or [])
    if getattr(client.tokenizer, "eos_token_id", None) is not None:
        stop_ids.append(client.tokenizer.eos_token_id)
    return parser.bind(client.tokenizer, stop_ids)


async def _radixflow_error(request: Request, exc: RadixflowError) -> Response:
    status = exc.status_code
    retry_after = getattr(exc, "retry_after", None)
    if status >= 500 and retry_after is None:  # a full server is no failure
        logger.error("%s %s failed: %s", request.method, request.url.path, exc)
    code = "context_length_exceeded" if isinstance(exc, ContextTooLong) else None
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return error_response(status, str(exc), param=getattr(exc, "param", None), code=code,
                          headers=headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    return await _radixflow_error(request, validation_error(exc.errors()))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    return error_response(exc.status_code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("%s %s raised", request.method, request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")


ERROR_HANDLERS = {
    RadixflowError: _radixflow_error,
    RequestValidationError: _validation_error,
    StarletteHTTPException: _http_error,
    Exception: _unexpected,
}
