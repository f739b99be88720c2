"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens.

A request is built as the chat request it means (anthropic_build) and answered through
`respond` as a Message (anthropic_format) or its stream of events (anthropic_stream); errors
come in Anthropic's shape (anthropic_errors).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..response_builder import ResponseBuilder
from .anthropic_build import build, count_tokens
from .anthropic_errors import AnthropicRoute
from .anthropic_format import MessageFormat
from .anthropic_protocol import CountTokensRequest, MessagesRequest
from .anthropic_stream import message_stream
from .openai_requests import BuildLimits, validate_body
from .respond import respond
from .responses import OrjsonResponse
from .state import ServerState, read_json, server_state

router = APIRouter(route_class=AnthropicRoute)
T = TypeVar("T")


async def _off_loop(request: Request, model: type,
                    make: Callable[[ServerState, Any], T]) -> tuple[ServerState, T]:
    """The body read, validated as `model` and made into something by `make`, off the event
    loop (templates render and prompts tokenize there)."""
    state = server_state(request)
    raw = await read_json(request)

    def run() -> T:
        body = validate_body(raw, model, served_model_name=state.served_model_name,
                             model_names=state.model_names)
        return make(state, body)

    return state, await asyncio.to_thread(run)


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    state, built = await _off_loop(request, MessagesRequest, lambda state, body: build(
        state.client, body, state.tool_parser, BuildLimits.of(state.args)))
    client, job = state.client, built.job
    fmt = MessageFormat(built, state.served_model_name)
    group = client.submit(job.reqs)
    builders = [ResponseBuilder(r, client.tokenizer) for r in job.reqs]
    stream = message_stream(fmt, group, builders) if job.stream else None
    return await respond(client, group, builders, request, stream=stream, result=fmt.result)


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(request: Request) -> Response:
    _, count = await _off_loop(request, CountTokensRequest, lambda state, body: count_tokens(
        state.client, body, state.tool_parser, BuildLimits.of(state.args)))
    return OrjsonResponse({"input_tokens": count})
