"""OpenAI-compatible routes: /v1/models[/{id}], /v1/completions, /v1/chat/completions.

Each handler reads its body (openai_requests), submits the GenerateReqs and answers through
`respond` with the endpoint's format (openai_responses).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from ..errors import InvalidRequest, ModelNotFound
from ..response_builder import ResponseBuilder
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .openai_requests import BuildLimits, Job, chat_job, completion_job, validate_body
from .openai_responses import ChatFormat, CompletionFormat, openai_stream
from .openai_tools import plan_tools
from .respond import respond
from .responses import OrjsonResponse
from .state import ServerState, read_json, server_state

router = APIRouter()


# Anthropic's client reads these routes too: each card carries its ModelInfo fields (type,
# display_name, created_at) and the list its paging fields; OpenAI's clients ignore them.
_EPOCH = "1970-01-01T00:00:00Z"  # `created: 0`


def _model_card(state: ServerState, name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "radixflow",
            "root": state.client.model_info.get("model_path"),
            "max_model_len": state.client.context_length,
            "type": "model", "display_name": name, "created_at": _EPOCH,
            "max_input_tokens": state.client.context_length}


def model_page(names: list[str], limit: int, after_id: str | None,
               before_id: str | None) -> tuple[list[str], bool]:
    """Anthropic's paging of the model list: (the page, whether more lie that way)."""
    for cursor in (after_id, before_id):
        if cursor is not None and cursor not in names:
            raise InvalidRequest(f"no model {cursor!r} to page from; this server serves "
                                 f"{', '.join(map(repr, names))}")
    if before_id is not None:
        names = names[:names.index(before_id)]
        return names[-limit:], len(names) > limit
    if after_id is not None:
        names = names[names.index(after_id) + 1:]
    return names[:limit], len(names) > limit


@router.get("/v1/models")
async def models(request: Request, limit: int = Query(1000, ge=1, le=1000),
                 after_id: str | None = None, before_id: str | None = None) -> Response:
    """OpenAI's list (every name), with Anthropic's paging (limit, after_id, before_id)."""
    state = server_state(request)
    page, more = model_page(state.served_model_names, limit, after_id, before_id)
    return OrjsonResponse({"object": "list", "data": [_model_card(state, n) for n in page],
                           "has_more": more, "first_id": page[0] if page else None,
                           "last_id": page[-1] if page else None})


@router.get("/v1/models/{model_id:path}")
async def model(request: Request, model_id: str) -> Response:
    state = server_state(request)
    if model_id not in state.model_names:
        raise ModelNotFound(f"the model {model_id!r} does not exist; this server serves "
                            f"{state.served_model_name!r}")
    return OrjsonResponse(_model_card(state, model_id))


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)

    def build() -> tuple[CompletionRequest, Job]:
        body = _validate(raw, state, CompletionRequest)
        return body, completion_job(state.client, body, BuildLimits.of(state.args))

    # Off the event loop: tokenizing a long prompt or checking a large schema takes a while,
    # and the streams of other requests keep flowing meanwhile.
    body, job = await asyncio.to_thread(build)
    fmt = CompletionFormat(job, state.served_model_name, body, state.client.tokenizer)
    return await _answer(request, state, job, fmt)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)

    def build() -> tuple[ChatCompletionRequest, Any, Job]:
        body = _validate(raw, state, ChatCompletionRequest)
        tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls,
                           state.tool_parser)
        job = chat_job(state.client, body, tools, state.tool_parser, BuildLimits.of(state.args))
        return body, tools, job

    body, tools, job = await asyncio.to_thread(build)  # renders, tokenizes: off the loop
    fmt = ChatFormat(job, state.served_model_name, body, tools, state.client.tokenizer)
    return await _answer(request, state, job, fmt)


def _validate(raw: Any, state: ServerState, model: type) -> Any:
    return validate_body(raw, model, served_model_name=state.served_model_name,
                         model_names=state.model_names)


async def _answer(request: Request, state: ServerState, job: Job,
                  fmt: CompletionFormat | ChatFormat) -> Response:
    client = state.client
    group = client.submit(job.reqs)
    # logprob tokens' texts come from their bytes (fmt: token_bytes.py), not the builders
    builders = [ResponseBuilder(r, client.tokenizer) for r in job.reqs]
    return await respond(client, group, builders, request,
                         stream=openai_stream(fmt, group, builders) if job.stream else None,
                         result=fmt.result)
