"""SGLang's offline call shapes, over anything that answers a native /generate body.

    engine.generate("The capital of France is", {"max_new_tokens": 8})
    engine.generate(["a", "b"], [params_a, params_b])
    engine.generate(input_ids=[[1, 2, 3]], sampling_params=params, return_logprob=True)
    for event in engine.generate(prompt, params, stream=True): ...
    out = await engine.async_generate(prompt, params)
    async for event in await engine.async_generate(prompt, params, stream=True): ...

A class that defines `generate_from_body(body)` (the in-process Engine, the HTTP Endpoint and
Runtime) gets these from `GenerateAPI`, so each takes exactly the calls SGLang's Engine takes and
returns the same dicts (`text`, `output_ids`, `meta_info`): one per prompt, a list for a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

# SGLang's generate() arguments that name a /generate body field of the same name.
_BODY_FIELDS = ("input_ids", "return_logprob", "logprob_start_len", "top_logprobs_num",
                "return_text_in_logprobs", "token_ids_logprob", "stream", "rid", "image_data",
                "lora_path", "custom_logit_processor", "return_hidden_states", "session_params",
                "separate_reasoning", "speculative", "prediction")


def generate_body(prompt: str | list[str] | None = None,
                  sampling_params: dict | list[dict] | None = None, **fields: Any) -> dict:
    """The native /generate body of a generate() call; fields left at None or False are left out
    (so the server's defaults apply and a field it does not support is only sent when used);
    speculative=False is sent: it turns off what the server's flag turns on."""
    if isinstance(prompt, dict):
        raise TypeError("generate() takes a prompt (str or list of str), not a request body; "
                        "use generate_from_body(body) to send a /generate body as it is")
    unknown = sorted(set(fields) - set(_BODY_FIELDS))
    if unknown:
        raise TypeError(f"generate() got unexpected keyword argument(s) {unknown}")
    body: dict[str, Any] = {"text": prompt, "sampling_params": sampling_params, **fields}
    return {k: v for k, v in body.items()
            if v is not None and (v is not False or k == "speculative")}


def prefill_only(text: str) -> dict:
    """The body that caches `text` and generates nothing (SGLang's warm-up request)."""
    return {"text": text, "sampling_params": {"max_new_tokens": 0}}


class GenerateAPI:
    """SGLang's `generate` / `async_generate` over `self.generate_from_body(body)`."""

    def generate_from_body(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        raise NotImplementedError

    def generate(self, prompt: str | list[str] | None = None,
                 sampling_params: dict | list[dict] | None = None, *,
                 input_ids: list[int] | list[list[int]] | None = None,
                 return_logprob: bool | list[bool] = False,
                 logprob_start_len: int | list[int] | None = None,
                 top_logprobs_num: int | list[int] | None = None,
                 return_text_in_logprobs: bool = False, stream: bool = False,
                 **more: Any) -> dict | list[dict] | Iterator[dict]:
        """Generate for one prompt (a dict), a batch (a list of dicts), or with stream=True an
        iterator of events for one prompt. `more`: `rid`, `session_params` (continue a request of
        a session, see `open_session`), and SGLang fields this runtime refuses
        with a message when set (`lora_path`, `image_data`, ...). Raises InvalidRequest for a
        bad request."""
        return self.generate_from_body(generate_body(
            prompt, sampling_params, input_ids=input_ids, return_logprob=return_logprob,
            logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs, stream=stream, **more))

    async def async_generate(self, prompt: str | list[str] | None = None,
                             sampling_params: dict | list[dict] | None = None, *,
                             stream: bool = False, **kwargs: Any) -> Any:
        """`generate` for asyncio code: awaits the result, or with stream=True returns an async
        iterator of events (`async for e in await engine.async_generate(..., stream=True)`)."""
        if stream:
            events = await asyncio.to_thread(self.generate, prompt, sampling_params,
                                             stream=True, **kwargs)
            return _async_events(events)
        return await asyncio.to_thread(self.generate, prompt, sampling_params, **kwargs)


async def _async_events(events: Iterator[dict]) -> AsyncIterator[dict]:
    done = object()
    try:
        while (event := await asyncio.to_thread(next, events, done)) is not done:
            yield event
    finally:
        close = getattr(events, "close", None)
        if close is not None:  # an abandoned stream aborts its request
            await asyncio.to_thread(close)
