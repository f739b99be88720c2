"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens.

A request is built as the chat request it means (anthropic_build) and answered through
`respond` as a Message (anthropic_format) or its stream of events (anthropic_stream); errors
come in Anthropic's shape (anthropic_errors).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..response_builder import ResponseBuilder
from .anthropic_build import Built, build, count_tokens
from .anthropic_errors import AnthropicRoute
from .anthropic_format import MessageFormat
from .anthropic_protocol import CountTokensRequest, MessagesRequest
from .anthropic_stream import message_stream
from .openai_requests import BuildLimits, validate_body
from .respond import respond
from .responses import OrjsonResponse
from .state import ServerState, read_json, server_state

router = APIRouter(route_class=AnthropicRoute)


def _validate(raw: Any, state: ServerState, model: type) -> Any:
    return validate_body(raw, model, served_model_name=state.served_model_name,
                         model_names=state.model_names)


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)

    def make() -> Built:
        body = _validate(raw, state, MessagesRequest)
        return build(state.client, body, state.tool_parser, BuildLimits.of(state.args))

    built = await asyncio.to_thread(make)  # renders, tokenizes: off the loop
    client, job = state.client, built.job
    fmt = MessageFormat(built, state.served_model_name)
    group = client.submit(job.reqs)
    builders = [ResponseBuilder(r, client.tokenizer) for r in job.reqs]
    stream = message_stream(fmt, group, builders) if job.stream else None
    return await respond(client, group, builders, request, stream=stream, result=fmt.result)


@router.post("/v1/messages/count_tokens")
async def count_message_tokens(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)

    def count() -> int:
        body = _validate(raw, state, CountTokensRequest)
        return count_tokens(state.client, body, state.tool_parser, BuildLimits.of(state.args))

    return OrjsonResponse({"input_tokens": await asyncio.to_thread(count)})
