"""/tokenize, /detokenize (also under /v1/) and /version, in the body shapes vLLM and SGLang
document: a prompt (or SGLang's list of prompts) or vLLM's chat messages in; token ids, their
count and the context length out; ids back to text (`prompt` for vLLM, `text` for SGLang)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import InvalidRequest
from ..request_building import tokenize_prompt
from ..version import VERSION
from .openai_protocol import DetokenizeRequest, TokenizeRequest
from .openai_requests import BuildLimits, render_chat, validate_body
from .responses import OrjsonResponse
from .state import ServerState, read_json, server_state

router = APIRouter()


@router.post("/tokenize")
@router.post("/v1/tokenize")
async def tokenize(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)
    # Rendering and tokenizing a large body takes a while: off the event loop.
    return OrjsonResponse(await asyncio.to_thread(_tokenize, raw, state))


def _tokenize(raw: object, state: ServerState) -> dict:
    body: TokenizeRequest = _validate(raw, state, TokenizeRequest)
    tokenizer = state.client.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequest("give either prompt or messages", param="prompt")
    if body.messages is not None:
        text = render_chat(tokenizer, body, None, state.tool_parser, BuildLimits.of(state.args))
        ids_list = [tokenizer.encode(text, add_special_tokens=bool(body.add_special_tokens))]
    else:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        ids_list = [_encode(tokenizer, p, body.add_special_tokens) for p in prompts]
    answer: dict = {"max_model_len": state.client.context_length}
    if isinstance(body.prompt, list):  # SGLang's batch shape: one entry per prompt
        answer.update(tokens=ids_list, count=[len(ids) for ids in ids_list])
    else:
        answer.update(tokens=ids_list[0], count=len(ids_list[0]))
    if body.return_token_strs:
        strs = [tokenizer.convert_ids_to_tokens(ids) for ids in ids_list]
        answer["token_strs"] = strs if isinstance(body.prompt, list) else strs[0]
    return answer


@router.post("/detokenize")
@router.post("/v1/detokenize")
async def detokenize(request: Request) -> Response:
    state = server_state(request)
    raw = await read_json(request)
    return OrjsonResponse(await asyncio.to_thread(_detokenize, raw, state))  # off the loop


def _detokenize(raw: object, state: ServerState) -> dict:
    body: DetokenizeRequest = _validate(raw, state, DetokenizeRequest)
    batch = bool(body.tokens) and isinstance(body.tokens[0], list)
    ids_list = body.tokens if batch else [body.tokens]
    vocab = state.client.vocab_size
    for ids in ids_list:
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside [0, {vocab})", param="tokens")
    texts = [state.client.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens)
             for ids in ids_list]
    text = texts if batch else texts[0]
    return {"prompt": text, "text": text}


@router.get("/version")
async def version(request: Request) -> Response:
    return OrjsonResponse({"version": VERSION})


def _encode(tokenizer, prompt: str, add_special_tokens: bool | None) -> list[int]:
    if add_special_tokens is False:
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    return tokenize_prompt(tokenizer, prompt)  # as /generate tokenizes a prompt


def _validate(raw: object, state: ServerState, model: type) -> object:
    if isinstance(raw, dict) and raw.get("model") is None:
        raw = {**raw, "model": state.served_model_name}  # `model` is optional here
    return validate_body(raw, model, served_model_name=state.served_model_name,
                         model_names=state.model_names)
