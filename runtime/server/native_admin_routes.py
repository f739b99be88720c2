"""SGLang's /abort_request and vLLM's /tokenizer_info (what lm-evaluation-harness's remote
tokenizer reads)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import InvalidRequest
from .responses import OrjsonResponse
from .state import read_json, server_state

router = APIRouter()

_ABORT_FIELDS = ("rid", "abort_all")
MAX_RID_CHARS = 1024


def parse_abort(body: Any) -> tuple[str, bool]:
    """SGLang's AbortReq body: {"rid": str, "abort_all": bool} -> (rid, abort_all)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    for key in body:
        if key not in _ABORT_FIELDS:
            raise InvalidRequest(f"unknown field {key!r}: /abort_request takes rid and "
                                 "abort_all", param=key)
    rid = body.get("rid")
    rid = "" if rid is None else rid
    if not isinstance(rid, str) or len(rid) > MAX_RID_CHARS:
        raise InvalidRequest(f"rid must be a string of at most {MAX_RID_CHARS} characters",
                             param="rid")
    abort_all = body.get("abort_all")
    if abort_all is not None and not isinstance(abort_all, bool):
        raise InvalidRequest(f"abort_all must be a boolean (got {abort_all!r})",
                             param="abort_all")
    return rid, bool(abort_all)


@router.post("/abort_request")
async def abort_request(request: Request) -> Response:
    """Stop a request another connection waits for (its response ends with an abort finish),
    or every live one with abort_all. 200 also for a rid that is not running, as SGLang."""
    rid, abort_all = parse_abort(await read_json(request))
    client = server_state(request).client
    rids = list(client.states) if abort_all else [rid] if rid else []
    for r in rids:
        client.abort_request(r)
    return Response(status_code=200)


def _token(tokenizer: Any, name: str) -> str | None:
    value = getattr(tokenizer, name, None)
    return None if value is None else str(value)


def tokenizer_info(tokenizer: Any, context_length: int) -> dict[str, Any]:
    """The special tokens, their ids and the chat template, under vLLM's names."""
    info: dict[str, Any] = {"tokenizer_class": type(tokenizer).__name__}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        info[name] = _token(tokenizer, name)
        info[f"{name}_id"] = getattr(tokenizer, f"{name}_id", None)
    template = getattr(tokenizer, "chat_template", None)
    info.update(chat_template=template if isinstance(template, str) else None,
                model_max_length=context_length, vocab_size=len(tokenizer),
                add_bos_token=getattr(tokenizer, "add_bos_token", None))
    return info


@router.get("/tokenizer_info")
async def get_tokenizer_info(request: Request) -> Response:
    client = server_state(request).client  # len() of a large vocabulary: off the loop
    info = await asyncio.to_thread(tokenizer_info, client.tokenizer, client.context_length)
    return OrjsonResponse(info)
