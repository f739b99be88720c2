"""OpenAI's Responses API: POST /v1/responses (create, streamed or not), GET / DELETE
/v1/responses/{id}, POST /v1/responses/{id}/cancel, GET /v1/responses/{id}/input_items.

A request is built as the chat request it means (responses_build) and answered through
`respond`; a stored response (store: true, the default) keeps its conversation so that
previous_response_id continues it (responses_store).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import InvalidRequest
from ..response_builder import ResponseBuilder
from .openai_requests import BuildLimits, validate_body
from .respond import respond
from .responses import OrjsonResponse
from .responses_build import Built, build, check_refused
from .responses_format import ResponseObject, output_items
from .responses_items import history_items, listed_item
from .responses_protocol import ResponsesRequest
from .responses_store import ResponseStore, Stored, response_store
from .responses_stream import response_stream
from .state import ServerState, read_json, server_state

router = APIRouter()
CANCEL_WAIT_S = 5.0  # how long a cancel waits for the generation to stop
MAX_LIST = 100


def _store(request: Request) -> ResponseStore:
    return response_store(request.app.state, server_state(request).args.max_stored_responses)


def _validate(raw: Any, state: ServerState) -> ResponsesRequest:
    body = validate_body(raw, ResponsesRequest, served_model_name=state.served_model_name,
                         model_names=state.model_names)
    check_refused(body)
    return body


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state, store = server_state(request), _store(request)
    raw = await read_json(request)
    body = await asyncio.to_thread(_validate, raw, state)
    history: list[dict] = []
    if body.previous_response_id is not None:
        prev = store.get(body.previous_response_id, param="previous_response_id")
        if prev.running:
            raise InvalidRequest(f"the response {body.previous_response_id!r} is still in "
                                 "progress", param="previous_response_id")
        history = [*prev.items, *history_items(prev.response["output"])]
    built = await asyncio.to_thread(build, state.client, body, history, state.tool_parser,
                                    BuildLimits.of(state.args))
    return await _run(request, state, store, built)


async def _run(request: Request, state: ServerState, store: ResponseStore,
               built: Built) -> Response:
    client, job = state.client, built.job
    obj = ResponseObject(built, state.served_model_name)
    record = Stored(obj.snapshot("in_progress", []), built.items,
                    rids=[r.rid for r in job.reqs])
    keep = built.body.store
    if keep:
        store.put(record)

    def end(final: dict) -> None:
        record.response, record.rids = final, []
        if keep and final["id"] in store:
            store.put(record)  # its size is known now

    group = client.submit(job.reqs)
    builders = [ResponseBuilder(r, client.tokenizer) for r in job.reqs]
    stream = None
    if job.stream:
        stream = response_stream(obj, group, builders, end, lambda: record.cancelled)

    def result(done: list[ResponseBuilder]) -> dict:
        end(obj.finished(done, output_items(built, done[0]), record.cancelled))
        return record.response

    try:
        response = await respond(client, group, builders, request, stream=stream,
                                 result=result)
    except BaseException:  # refused by the scheduler, or the server failed
        store.pop(obj.id)
        raise
    if not job.stream and record.running:  # its client hung up
        store.pop(obj.id)
    return response


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> Response:
    if request.query_params.get("stream") in ("true", "1"):
        raise InvalidRequest("stream is only for background responses, which radixflow does "
                             "not run", param="stream")
    return OrjsonResponse(_store(request).get(response_id).response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    store = _store(request)
    record = store.get(response_id)
    if record.running:
        _abort(request, record)
    store.pop(response_id)
    return OrjsonResponse({"id": response_id, "object": "response", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> Response:
    """Stops a response still being generated; its status becomes "cancelled"."""
    record = _store(request).get(response_id)
    if not record.running:
        raise InvalidRequest(f"Cannot cancel a response with status "
                             f"{record.response['status']!r}.", param="response_id")
    _abort(request, record)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CANCEL_WAIT_S
    while record.running and loop.time() < deadline:
        await asyncio.sleep(0.01)
    if record.running:
        return OrjsonResponse({**record.response, "status": "cancelled"})
    return OrjsonResponse(record.response)


def _abort(request: Request, record: Stored) -> None:
    record.cancelled = True
    client = server_state(request).client
    for rid in record.rids:
        client.abort_request(rid)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request) -> Response:
    """The items a response was made from (previous turns included), newest first unless
    order=asc; `limit` (1-100, default 20), `after` and `before` (item ids) page them."""
    record = _store(request).get(response_id)
    q = request.query_params
    unknown = set(q) - {"limit", "order", "after", "before", "include"}
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(f"unknown query parameter {name!r}", param=name)
    if q.getlist("include"):
        raise InvalidRequest("include is not supported: radixflow returns no extra data",
                             param="include")
    limit = q.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= MAX_LIST:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIST}", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest('order must be "asc" or "desc"', param="order")
    items = [listed_item(i) for i in record.items]
    if order == "desc":
        items.reverse()
    ids = [i["id"] for i in items]
    for key in ("after", "before"):
        if key in q and q[key] not in ids:
            raise InvalidRequest(f"{key}: no item {q[key]!r} in this response", param=key)
    start = ids.index(q["after"]) + 1 if "after" in q else 0
    stop = ids.index(q["before"]) if "before" in q else len(items)
    page = items[start:stop][:int(limit)]
    return OrjsonResponse({"object": "list", "data": page,
                           "first_id": page[0]["id"] if page else None,
                           "last_id": page[-1]["id"] if page else None,
                           "has_more": start + len(page) < stop})
