"""The SGLang-compatible native routes: /generate, /program, sessions, health, info, cache,
metrics (and, from native_admin_routes, /abort_request and /tokenizer_info)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from ..errors import InvalidRequest, ServerUnavailable, TooManyOpen
from ..model_loader.generation_defaults import defaults_of
from ..native_api import ParsedGenerate, describe_model, parse_generate
from ..program import execute_program
from ..program.errors import ProgramCancelled
from ..response_builder import ResponseBuilder, raise_if_rejected
from ..session_requests import parse_close_session, parse_open_session
from .data_parallel import replica_info
from .disconnect import CLIENT_CLOSED, ClientGone, until_disconnect
from .embedding_routes import embed_once
from .metrics import CONTENT_TYPE
from .native_admin_routes import router as admin_router
from .respond import collect, respond
from .responses import SSE_DONE, OrjsonResponse, error_body, error_response, sse
from .scheduler_client import RequestGroup, SchedulerClient
from .state import ServerState, read_json, server_state

VERSION = "0.1.0"

router = APIRouter()
router.include_router(admin_router)  # /abort_request, /tokenizer_info


@router.post("/generate")
async def generate(request: Request) -> Response:
    state = server_state(request)
    client = state.client
    body = await read_json(request)
    # Off the event loop: tokenizing a long prompt or checking a large schema takes a while,
    # and the streams of other requests keep flowing meanwhile.
    parsed = await asyncio.to_thread(
        parse_generate, body, client.tokenizer, client.context_length,
        vocab_size=client.vocab_size, reasoning=client.reasoning,
        max_prompts=state.args.max_prompts_per_request,
        priority_scheduling=state.args.enable_priority_scheduling,
        sampling_defaults=defaults_of(client.model_info))
    group = client.submit(parsed.reqs)
    builders = parsed.builders(client.tokenizer)
    return await respond(
        client, group, builders, request,
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


async def generate_json(client: SchedulerClient, body: Any) -> Any:
    """/generate for in-process callers (/health_generate): the response object."""
    return await run_parsed(client, _parse_json_body(client, body))


def _parse_json_body(client: SchedulerClient, body: Any,
                     max_prompts: int | None = None) -> ParsedGenerate:
    if isinstance(body, dict):
        body = {**body, "stream": False}
    return parse_generate(body, client.tokenizer, client.context_length,
                          vocab_size=client.vocab_size, reasoning=client.reasoning,
                          max_prompts=max_prompts, sampling_defaults=defaults_of(client.model_info))


async def run_parsed(client: SchedulerClient, parsed: ParsedGenerate) -> Any:
    """Submit `parsed`, wait for all of it: the response object. Cancelled: its requests are
    aborted in the scheduler."""
    builders = parsed.builders(client.tokenizer)
    async with client.submit(parsed.reqs) as group:
        await collect(group, builders)
    raise_if_rejected(builders)
    return parsed.response([b.result() for b in builders])


class ProgramRun:
    """The /generate calls of one program, made from its thread (and its forks' threads).

    `cancel()` (the client hung up) aborts the generations in flight and makes every later
    call raise ProgramCancelled, so the program's thread comes back to the pool at once.
    """

    def __init__(self, state: ServerState, loop: asyncio.AbstractEventLoop):
        self.client = state.client
        self.loop = loop
        # A select scores its choices in one batch: up to --max-select-choices prompts.
        self.max_prompts = max(state.args.max_prompts_per_request,
                               state.args.max_select_choices)
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future] = set()

    def generate(self, gen_body: dict) -> Any:
        """One native /generate call (on a program thread: parsing happens here)."""
        self._check()
        parsed = _parse_json_body(self.client, gen_body, self.max_prompts)
        self._check()
        future = asyncio.run_coroutine_threadsafe(run_parsed(self.client, parsed), self.loop)
        with self._lock:
            self._in_flight.add(future)
        if self.cancelled.is_set():
            future.cancel()
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ProgramCancelled("the program was stopped: its client hung up") from None
        finally:
            with self._lock:
                self._in_flight.discard(future)

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise ProgramCancelled("the program was stopped: its client hung up")

    def cancel(self) -> None:
        self.cancelled.set()
        with self._lock:
            in_flight = list(self._in_flight)
        for future in in_flight:
            future.cancel()  # its task is cancelled on the loop: its requests are aborted


@router.post("/program")
async def program(request: Request) -> Response:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise InvalidRequest("the program must be a JSON object")
    state = server_state(request)
    run = ProgramRun(state, asyncio.get_running_loop())
    work = asyncio.get_running_loop().run_in_executor(
        state.program_pool, functools.partial(
            execute_program, body, run.generate,
            max_select_choices=state.args.max_select_choices))
    try:
        result = await until_disconnect(work, request)
    except ClientGone:
        # Its generation in flight is aborted, no later one starts: the thread comes back.
        run.cancel()
        return Response(status_code=CLIENT_CLOSED)
    except BaseException:
        run.cancel()
        raise
    return OrjsonResponse(result)


@router.get("/health")
async def health(request: Request) -> Response:
    client = server_state(request).client
    if not client.is_healthy:
        return error_response(503, client.failure or "unhealthy")
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    client = server_state(request).client
    if client.model_info.get("embedding") is not None:  # --is-embedding: embed one token
        probe = embed_once(client)
    else:
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
        probe = generate_json(client, body)
    await asyncio.wait_for(probe, timeout=60)
    return Response(status_code=200)


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request) -> Response:
    state = server_state(request)
    return OrjsonResponse(describe_model(
        state.client.model_info, state.client.tokenizer, tokenizer_path=state.args.tokenizer,
        served_model_name=state.served_model_name))


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(request: Request) -> Response:
    return OrjsonResponse(server_info(server_state(request)))


def server_info(state: ServerState) -> dict:
    client = state.client
    info = state.args.public_info()
    # the name the server answers to, as SGLang reports it (its default: the model path)
    info.update(served_model_name=state.served_model_name,
                served_model_names=state.served_model_names)
    info.update(model_info=client.model_info, version=VERSION, healthy=client.is_healthy,
                failure=client.failure, processes=state.processes)
    s = client.stats
    if s is not None:
        info.update(num_running=s.num_running, num_waiting=s.num_waiting,
                    kv_used_tokens=s.kv_used_tokens, kv_total_tokens=s.kv_total_tokens,
                    cache_hit_tokens=s.cache_hit_tokens, prompt_tokens=s.prompt_tokens,
                    generation_tokens=s.generation_tokens, stats_time=client.stats_time)
    info["num_pending_requests"] = len(client.states)
    # Per scheduler replica (--dp-size): load, requests routed, cache hit rate.
    info["replicas"] = replica_info(client)
    return info


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request) -> Response:
    if not await server_state(request).client.flush_cache():
        return error_response(400, "cache not flushed: requests are still running; "
                                   "retry when the server is idle")
    return PlainTextResponse("Cache flushed.\n")


@router.api_route("/open_session", methods=["GET", "POST"])
async def open_session(request: Request) -> Response:
    """SGLang's: {"capacity_of_str_len": int, "session_id": str | null, "timeout": seconds |
    null} -> the session id, a JSON string. /generate bodies then carry
    "session_params": {"id": session_id, "rid": ...} (runtime/scheduler/sessions.py)."""
    msg = parse_open_session(await read_json(request))
    done = await server_state(request).client.open_session(msg)
    if not done.success:
        message = done.message or "the session was not opened"
        if done.status_code == 429:  # past --max-open-sessions: one closing makes room
            raise TooManyOpen(message, retry_after=1)
        raise InvalidRequest(message, param="session_id")
    return OrjsonResponse(done.session_id)


@router.api_route("/close_session", methods=["GET", "POST"])
async def close_session(request: Request) -> Response:
    """SGLang's: {"session_id": str} -> 200 with no body, also when no such session is open."""
    server_state(request).client.close_session(parse_close_session(await read_json(request)))
    return Response(status_code=200)


@router.post("/concate_and_append_request")
async def concate_and_append_request() -> Response:
    # SGLang's frontend still calls it for join(mode="concate_and_append"); SGLang's server
    # dropped it (404). Answering success without joining anything would be a lie.
    return error_response(
        404, "/concate_and_append_request is not supported (SGLang's server no longer has it "
             "either): it would join finished requests' KV into another request. To continue a "
             "request without sending its tokens again, use a session: /open_session, then "
             "/generate with \"session_params\": {\"id\": <session id>, \"rid\": <rid to "
             "continue>}; or send the joined text, whose prefix the radix cache reuses.")


@router.get("/metrics")
async def get_metrics(request: Request) -> Response:
    metrics = server_state(request).metrics
    if metrics is None:
        return error_response(404, "metrics are disabled")
    return Response(metrics.render(), media_type=CONTENT_TYPE)
