"""Embeddings: /v1/embeddings (OpenAI) and /encode (SGLang), on a --is-embedding server.

Each handler reads its body (embedding_protocol), turns its inputs into one GenerateReq each
off the event loop (embedding_requests), submits them together, so the scheduler prefills them
in one batch where they fit, and answers once all finished (respond) with the endpoint's
shape. A generation server answers both with a 400 naming --is-embedding.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from ..errors import InvalidRequest
from ..response_builder import raise_if_rejected
from .embedding_protocol import EmbeddingRequest, EncodeRequest
from .embedding_requests import (
    EmbeddingBuilder,
    EmbeddingJob,
    embedding_info,
    embedding_job,
    encode_inputs,
    encode_result,
    openai_inputs,
)
from .openai_requests import validate_body
from .respond import collect, respond
from .responses import validation_error
from .scheduler_client import SchedulerClient
from .state import ServerState, read_json, server_state

router = APIRouter()


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)
    embedding_info(state.client)  # a generation server: the 400 before anything is parsed

    def build() -> tuple[EmbeddingRequest, EmbeddingJob]:
        body = validate_body(raw, EmbeddingRequest, served_model_name=state.served_model_name,
                             model_names=state.model_names)
        items, batch = openai_inputs(body.input)
        return body, embedding_job(state.client, items, batch=batch,
                                   dimensions=body.dimensions, param="input")

    body, job = await asyncio.to_thread(build)  # tokenizes: off the loop

    def result(builders: list[EmbeddingBuilder]) -> dict:
        encode = _base64 if body.encoding_format == "base64" else list
        return {"object": "list", "model": state.served_model_name,
                "data": [{"object": "embedding", "index": i, "embedding": encode(b.vector())}
                         for i, b in enumerate(builders)],
                "usage": {"prompt_tokens": job.prompt_tokens, "total_tokens": job.prompt_tokens}}

    return await _answer(request, state, job, result)


@router.post("/encode")
async def encode(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)
    embedding_info(state.client)

    def build() -> EmbeddingJob:
        body = _parse(raw, EncodeRequest)
        items, batch, param = encode_inputs(body.text, body.input_ids)
        return embedding_job(state.client, items, batch=batch, dimensions=body.dimensions,
                             param=param)

    job = await asyncio.to_thread(build)

    return await _answer(request, state, job, lambda builders: encode_result(builders, job))


async def embed_once(client: SchedulerClient) -> list[float]:
    """One token's embedding, waited for (/health_generate on an embedding server)."""
    job = embedding_job(client, [[0]], batch=False, dimensions=None, param="input_ids")
    builders = [EmbeddingBuilder(r, client.tokenizer) for r in job.reqs]
    async with client.submit(job.reqs) as group:
        await collect(group, builders)
    raise_if_rejected(builders)
    return builders[0].vector()


async def _answer(request: Request, state: ServerState, job: EmbeddingJob,
                  result: Callable[[list[EmbeddingBuilder]], Any]) -> Response:
    client = state.client
    group = client.submit(job.reqs)
    builders = [EmbeddingBuilder(r, client.tokenizer) for r in job.reqs]
    return await respond(client, group, builders, request, stream=None, result=result)


def _parse(raw: Any, model: type[BaseModel]) -> Any:
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        return model.model_validate(raw, strict=None)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _base64(vector: list[float]) -> str:
    """OpenAI's base64 encoding: the little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
