"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from ..errors import InvalidRequest, ModelNotFound, ServerUnavailable
from ..messages import GenerateReq
from ..native_api import (
    ResponseBuilder,
    check_constraint,
    fit_to_context,
    new_rid,
    tokenize_prompt,
)
from ..sampling_params import SamplingParams
from .http_server import (
    SSE_DONE,
    OrjsonResponse,
    collect,
    error_body,
    read_json,
    respond,
    sse,
    validation_error_response,
)
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .openai_tools import ToolPlan, plan_tools, with_tools
from .tokenizer_manager import RequestGroup, TokenizerManager

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class _Job:
    """One OpenAI request turned into GenerateReqs: choice i is reqs[i]."""

    reqs: list[GenerateReq]
    prompts: list[list[int]]  # one per distinct prompt; choice i uses prompts[i // n]
    prompt_texts: list[str]
    n: int


def _sampling(body: CompletionRequest | ChatCompletionRequest, max_tokens: int | None,
              choice: int, constraint: dict | None = None) -> SamplingParams:
    d: dict[str, Any] = {
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty, "repetition_penalty": body.repetition_penalty,
        "stop": body.stop, "stop_token_ids": body.stop_token_ids, "ignore_eos": body.ignore_eos,
        "min_new_tokens": body.min_tokens, "skip_special_tokens": body.skip_special_tokens,
        "no_stop_trim": body.no_stop_trim, "regex": body.regex, "ebnf": body.ebnf,
        "json_schema": body.json_schema,
    }
    if max_tokens is not None:
        d["max_new_tokens"] = max_tokens
    if body.seed is not None:
        # Every choice gets its own stream of randomness, reproducible from the seed.
        d["seed"] = (body.seed + choice) % (1 << 63)
    fmt = body.response_format
    if constraint:  # from tools
        if (fmt is not None and fmt.type != "text") or any(
                d[k] is not None for k in ("regex", "ebnf", "json_schema")):
            raise InvalidRequest("tools cannot be combined with response_format, regex, ebnf "
                                 'or json_schema (unless tool_choice is "none")', param="tools")
        d.update(constraint)
    if fmt is not None and fmt.type != "text":
        if body.regex is not None or body.ebnf is not None or body.json_schema is not None:
            raise InvalidRequest("response_format cannot be combined with regex, ebnf or "
                                 "json_schema", param="response_format")
        if fmt.type == "json_object":
            d["json_schema"] = json.dumps({"type": "object"})
        else:
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise InvalidRequest("response_format of type json_schema needs "
                                     "json_schema.schema", param="response_format.json_schema")
            d["json_schema"] = json.dumps(fmt.json_schema.schema_)
    sampling = SamplingParams.from_dict(d)
    check_constraint(sampling)  # a bad schema is a 400 here, before the scheduler
    return sampling


def _build_job(tm: TokenizerManager, body: CompletionRequest | ChatCompletionRequest,
               prompts: list[list[int]], prompt_texts: list[str], max_tokens: int | None, *,
               logprobs: int | None, echo: bool = False,
               constraint: dict | None = None) -> _Job:
    if body.logit_bias:
        raise InvalidRequest("logit_bias is not supported", param="logit_bias")
    reqs = []
    for p, ids in enumerate(prompts):
        if not ids:
            raise InvalidRequest("the prompt is empty (it has no tokens)", param="prompt")
        explicit = max_tokens is not None
        room = tm.context_length - len(ids)
        for j in range(body.n):
            sampling = _sampling(body, max_tokens if explicit else max(room, 0), p * body.n + j,
                                 constraint)
            sampling = fit_to_context(sampling, len(ids), tm.context_length, strict=explicit)
            reqs.append(GenerateReq(
                rid=new_rid(), input_ids=ids, sampling=sampling,
                return_logprob=logprobs is not None, logprob_start_len=0 if echo else -1,
                top_logprobs_num=logprobs or 0, stream=body.stream))
    return _Job(reqs=reqs, prompts=prompts, prompt_texts=prompt_texts, n=body.n)


def _usage(job: _Job, builders: list[ResponseBuilder]) -> dict:
    prompt = sum(builders[p * job.n].prompt_tokens for p in range(len(job.prompts)))
    cached = sum(builders[p * job.n].cached_tokens for p in range(len(job.prompts)))
    completion = sum(b.completion_tokens for b in builders)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish(b: ResponseBuilder) -> str | None:
    if b.finish_reason is None:
        return None
    return _FINISH.get(b.finish_reason["type"], "stop")


def _token_bytes(text: str | None) -> list[int]:
    return list((text or "").encode("utf-8"))


def _chat_logprobs(entries: list[list], tops: list[list | None]) -> dict:
    content = []
    for k, (lp, _tid, text) in enumerate(entries):
        top = tops[k] if k < len(tops) and tops[k] else []
        content.append({
            "token": text or "", "logprob": lp, "bytes": _token_bytes(text),
            "top_logprobs": [{"token": t or "", "logprob": tl, "bytes": _token_bytes(t)}
                             for tl, _, t in top],
        })
    return {"content": content, "refusal": None}


def _completion_logprobs(entries: list[list], tops: list[list | None], offset: int) -> dict:
    tokens, token_logprobs, top_logprobs, text_offset = [], [], [], []
    for k, (lp, _tid, text) in enumerate(entries):
        tokens.append(text or "")
        token_logprobs.append(lp)
        top = tops[k] if k < len(tops) else None
        top_logprobs.append(None if top is None else {t or "": tl for tl, _, t in top})
        text_offset.append(offset)
        offset += len(text or "")
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
            "text_offset": text_offset}


def create_openai_router(tm: TokenizerManager, served_model_name: str) -> APIRouter:
    router = APIRouter()
    names = {served_model_name, str(tm.model_info.get("model_path"))}

    async def parse(request: Request, model: type) -> Any:
        raw = await read_json(request)
        if not isinstance(raw, dict):
            raise InvalidRequest("the request body must be a JSON object")
        try:
            body = model.model_validate(raw, strict=None)
        except ValidationError as exc:
            raise _Invalid(exc) from None
        if body.model not in names:
            raise ModelNotFound(f"the model {body.model!r} does not exist; this server serves "
                                f"{served_model_name!r}")
        return body

    async def run(job: _Job, request: Request, stream_fn: Any, result_fn: Any,
                  return_text: bool) -> Response:
        group = tm.submit(job.reqs)
        builders = [ResponseBuilder(r, tm.tokenizer, return_text_in_logprobs=return_text)
                    for r in job.reqs]
        stream = job.reqs[0].stream
        return await respond(tm, group, builders, request, stream=stream,
                             stream_body=stream_fn(group, builders) if stream else None,
                             result=result_fn)

    @router.get("/v1/models")
    async def models() -> Response:
        return OrjsonResponse({"object": "list", "data": [{
            "id": served_model_name, "object": "model", "created": 0, "owned_by": "radixflow",
            "root": tm.model_info.get("model_path"), "max_model_len": tm.context_length}]})

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: CompletionRequest = await parse(request, CompletionRequest)
        if body.suffix:
            raise InvalidRequest("suffix is not supported", param="suffix")
        if body.best_of is not None and body.best_of != body.n:
            raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
        if body.echo and body.stream:
            raise InvalidRequest("echo is not supported with stream", param="echo")
        prompt = body.prompt
        if isinstance(prompt, str):
            texts = [prompt]
        elif prompt and all(isinstance(p, str) for p in prompt):
            texts = list(prompt)  # type: ignore[arg-type]
        elif prompt and all(isinstance(p, int) for p in prompt):
            texts = [None]  # type: ignore[list-item]
            prompt = [prompt]  # type: ignore[list-item]
        else:
            texts = [None] * len(prompt)  # type: ignore[list-item]
        if not texts:
            raise InvalidRequest("prompt must not be empty", param="prompt")
        ids_list: list[list[int]] = []
        for k, text in enumerate(texts):
            if text is not None:
                ids_list.append(tokenize_prompt(tm.tokenizer, text))
            else:
                ids = list(prompt[k])  # type: ignore[arg-type, index]
                if any(not 0 <= t < tm.vocab_size for t in ids):
                    raise InvalidRequest(f"prompt holds a token id outside [0, {tm.vocab_size})",
                                         param="prompt")
                ids_list.append(ids)
        prompt_texts = [t if t is not None else tm.tokenizer.decode(ids)
                        for t, ids in zip(texts, ids_list)]
        job = _build_job(tm, body, ids_list, prompt_texts, body.max_tokens,
                         logprobs=body.logprobs, echo=body.echo)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def choice(i: int, b: ResponseBuilder) -> dict:
            prefix = job.prompt_texts[i // job.n] if body.echo else ""
            logprobs = None
            if body.logprobs is not None:
                entries, tops = b.output_logprobs, b.output_top_logprobs
                if body.echo:
                    entries, tops = b.input_logprobs + entries, b.input_top_logprobs + tops
                logprobs = _completion_logprobs(entries, tops, 0)
            return {"index": i, "text": prefix + b.text, "logprobs": logprobs,
                    "finish_reason": _finish(b)}

        def result(builders: list[ResponseBuilder]) -> dict:
            return {"id": rid, "object": "text_completion", "created": created,
                    "model": served_model_name,
                    "choices": [choice(i, b) for i, b in enumerate(builders)],
                    "usage": _usage(job, builders)}

        async def stream(group: RequestGroup, builders: list[ResponseBuilder]
                         ) -> AsyncIterator[bytes]:
            sent_text = [0] * len(builders)
            sent_lp = [0] * len(builders)

            def chunk(choices: list[dict], usage: dict | None = None) -> bytes:
                return sse({"id": rid, "object": "text_completion", "created": created,
                            "model": served_model_name, "choices": choices, "usage": usage})

            try:
                while not group.done:
                    items = await group.next()
                    touched = dict.fromkeys(i for i, _ in items)
                    for i, out in items:
                        builders[i].add(out)
                    for i in touched:
                        b = builders[i]
                        delta = b.text[sent_text[i]:]
                        lp = None
                        if body.logprobs is not None:
                            lp = _completion_logprobs(b.output_logprobs[sent_lp[i]:],
                                                      b.output_top_logprobs[sent_lp[i]:],
                                                      sent_text[i])
                            sent_lp[i] = len(b.output_logprobs)
                        sent_text[i] = max(sent_text[i], len(b.text))
                        if delta or b.finished:
                            yield chunk([{"index": i, "text": delta, "logprobs": lp,
                                          "finish_reason": _finish(b)}])
                if include_usage:
                    yield chunk([], _usage(job, builders))
            except ServerUnavailable as exc:
                yield sse(error_body(503, str(exc)))
            yield SSE_DONE

        return await run(job, request, stream, result, return_text=body.logprobs is not None)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = await parse(request, ChatCompletionRequest)
        tools = plan_tools(body.tools, body.tool_choice)
        if body.top_logprobs and not body.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        text = render_chat(tm.tokenizer, body, tools)
        ids = tm.tokenizer.encode(text, add_special_tokens=False)
        max_tokens = body.max_completion_tokens or body.max_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        job = _build_job(tm, body, [ids], [text], max_tokens, logprobs=logprobs,
                         constraint=tools.sampling_fields() if tools else None)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        def result(builders: list[ResponseBuilder]) -> dict:
            choices = []
            for i, b in enumerate(builders):
                message, finish = {"role": "assistant", "content": b.text}, _finish(b)
                if tools is not None:
                    message, finish = tools.message(b.text, finish)
                choices.append({
                    "index": i, "message": message,
                    "logprobs": (_chat_logprobs(b.output_logprobs, b.output_top_logprobs)
                                 if body.logprobs else None),
                    "finish_reason": finish})
            return {"id": rid, "object": "chat.completion", "created": created,
                    "model": served_model_name, "choices": choices,
                    "usage": _usage(job, builders)}

        async def stream(group: RequestGroup, builders: list[ResponseBuilder]
                         ) -> AsyncIterator[bytes]:
            sent_text = [0] * len(builders)
            sent_lp = [0] * len(builders)

            def chunk(choices: list[dict], usage: dict | None = None) -> bytes:
                return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                            "model": served_model_name, "choices": choices, "usage": usage})

            try:
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}
                             for i in range(len(builders))])
                if tools is not None:
                    await collect(group, builders)
                    for i, b in enumerate(builders):
                        yield chunk([_tool_chunk_choice(i, b, tools, body.logprobs)])
                while not group.done:
                    items = await group.next()
                    touched = dict.fromkeys(i for i, _ in items)
                    for i, out in items:
                        builders[i].add(out)
                    for i in touched:
                        b = builders[i]
                        delta = b.text[sent_text[i]:]
                        sent_text[i] = max(sent_text[i], len(b.text))
                        lp = None
                        if body.logprobs:
                            lp = _chat_logprobs(b.output_logprobs[sent_lp[i]:],
                                                b.output_top_logprobs[sent_lp[i]:])
                            sent_lp[i] = len(b.output_logprobs)
                        if delta or b.finished or lp:
                            yield chunk([{"index": i, "delta": {"content": delta} if delta else {},
                                          "logprobs": lp, "finish_reason": _finish(b)}])
                if include_usage:
                    yield chunk([], _usage(job, builders))
            except ServerUnavailable as exc:
                yield sse(error_body(503, str(exc)))
            yield SSE_DONE

        return await run(job, request, stream, result, return_text=body.logprobs)

    return router


class _Invalid(InvalidRequest):
    """A pydantic validation failure, rendered as one clear message naming the field."""

    def __init__(self, exc: ValidationError):
        response = validation_error_response(exc.errors())
        err = json.loads(response.body)["error"]
        super().__init__(err["message"], param=err["param"])


def _tool_chunk_choice(i: int, b: ResponseBuilder, tools: ToolPlan, logprobs: bool) -> dict:
    """A finished choice of a streamed request with tools, as one chunk."""
    message, finish = tools.message(b.text, _finish(b))
    delta: dict[str, Any] = {}
    if message["content"]:
        delta["content"] = message["content"]
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": k, **call}
                               for k, call in enumerate(message["tool_calls"])]
    return {"index": i, "delta": delta, "finish_reason": finish,
            "logprobs": (_chat_logprobs(b.output_logprobs, b.output_top_logprobs)
                         if logprobs else None)}


def render_chat(tokenizer: Any, body: ChatCompletionRequest,
                tools: ToolPlan | None = None) -> str:
    """The prompt text: the model's chat template applied to the messages (and tools)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("this model has no chat template; use /v1/completions",
                             param="messages")
    messages = []
    for m in body.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        messages.append(msg)
    messages, tool_kwargs = with_tools(tokenizer, messages, body.messages, tools)
    continue_final = body.continue_final_message
    if continue_final and body.messages[-1].role != "assistant":
        raise InvalidRequest("continue_final_message needs a final assistant message",
                             param="continue_final_message")
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False,
            add_generation_prompt=body.add_generation_prompt and not continue_final,
            continue_final_message=continue_final, **tool_kwargs,
            **(body.chat_template_kwargs or {}))
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 -- any template error (jinja, raise_exception)
        raise InvalidRequest(f"the chat template rejected the messages: {exc}",
                             param="messages") from None
