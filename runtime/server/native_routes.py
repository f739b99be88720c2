"""The SGLang-compatible native routes: /generate, /program, health, info, cache, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from ..errors import InvalidRequest, ServerUnavailable
from ..native_api import ResponseBuilder, parse_generate, raise_if_rejected
from ..program import execute_program
from .metrics import CONTENT_TYPE
from .respond import collect, respond
from .responses import SSE_DONE, OrjsonResponse, error_body, error_response, sse
from .state import ServerState, read_json, server_state
from .tokenizer_manager import RequestGroup, TokenizerManager

VERSION = "0.1.0"

router = APIRouter()


@router.post("/generate")
async def generate(request: Request) -> Response:
    tm = server_state(request).tm
    parsed = parse_generate(await read_json(request), tm.tokenizer, tm.context_length,
                            vocab_size=tm.vocab_size)
    group = tm.submit(parsed.reqs)
    builders = parsed.builders(tm.tokenizer)
    return await respond(
        tm, group, builders, request,
        stream=native_stream(group, builders) if parsed.stream else None,
        result=lambda bs: parsed.response([b.result() for b in bs]))


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


async def generate_json(tm: TokenizerManager, body: Any) -> Any:
    """/generate for in-process callers (the /program executor): the response object."""
    if isinstance(body, dict):
        body = {**body, "stream": False}
    parsed = parse_generate(body, tm.tokenizer, tm.context_length, vocab_size=tm.vocab_size)
    builders = parsed.builders(tm.tokenizer)
    async with tm.submit(parsed.reqs) as group:
        await collect(group, builders)
    raise_if_rejected(builders)
    return parsed.response([b.result() for b in builders])


@router.post("/program")
async def program(request: Request) -> Response:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the program must be a JSON object")
    state = server_state(request)
    loop = asyncio.get_running_loop()

    def generate_sync(gen_body: dict) -> dict:
        return asyncio.run_coroutine_threadsafe(generate_json(state.tm, gen_body), loop).result()

    result = await loop.run_in_executor(state.program_pool, execute_program, body, generate_sync)
    return OrjsonResponse(result)


@router.get("/health")
async def health(request: Request) -> Response:
    tm = server_state(request).tm
    if not tm.is_healthy:
        return error_response(503, tm.failure or "unhealthy")
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    await asyncio.wait_for(generate_json(server_state(request).tm, body), timeout=60)
    return Response(status_code=200)


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> Response:
    state = server_state(request)
    info = dict(state.tm.model_info)
    info.setdefault("tokenizer_path", state.args.tokenizer or info.get("model_path"))
    tok = state.tm.tokenizer
    info.update(is_generation=True, served_model_name=state.served_model_name,
                chat_template=getattr(tok, "chat_template", None),
                bos_token=getattr(tok, "bos_token", None),
                eos_token=getattr(tok, "eos_token", None))
    return OrjsonResponse(info)


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(request: Request) -> Response:
    return OrjsonResponse(server_info(server_state(request)))


def server_info(state: ServerState) -> dict:
    tm = state.tm
    info = {k: v for k, v in dataclasses.asdict(state.args).items() if k != "api_key"}
    info["api_key_set"] = state.args.api_key is not None
    info.update(model_info=tm.model_info, version=VERSION, healthy=tm.is_healthy,
                failure=tm.failure, processes=state.processes)
    s = tm.stats
    if s is not None:
        info.update(num_running=s.num_running, num_waiting=s.num_waiting,
                    kv_used_tokens=s.kv_used_tokens, kv_total_tokens=s.kv_total_tokens,
                    cache_hit_tokens=s.cache_hit_tokens, prompt_tokens=s.prompt_tokens,
                    generation_tokens=s.generation_tokens, stats_time=tm.stats_time)
    info["num_pending_requests"] = len(tm.states)
    return info


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    if not await server_state(request).tm.flush_cache():
        return error_response(400, "cache not flushed: requests are still running; "
                                   "retry when the server is idle")
    return PlainTextResponse("Cache flushed.\n")


@router.post("/concate_and_append_request")
async def concate_and_append_request() -> Response:
    # The next /generate carries the joined text anyway (protocol doc, section 8.2).
    return OrjsonResponse({"success": True})


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    metrics = server_state(request).metrics
    if metrics is None:
        return error_response(404, "metrics are disabled")
    return Response(metrics.render(), media_type=CONTENT_TYPE)
