"""OpenAI: remote models behind an OpenAI-compatible API, where the features exist there.

A program without roles uses /completions with the text so far; a program with roles uses
/chat/completions with its messages, and its gens must sit in an assistant turn. gen's
sampling options take their OpenAI names from radixflow's OpenAI request models (max_tokens,
min_tokens, stop, temperature, ...), each sent only when it differs from its default, so a
remote API that lacks an extension (top_k, ...) never sees it unasked; json_schema becomes
`response_format`; regex the `regex` extension field that radixflow's and SGLang's OpenAI
APIs accept. select has no prompt log-probabilities there, so it becomes a generation
constrained to the choices (regex).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

from radixflow.runtime.program import ProgramExecutor
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.server.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    sampling_names,
)

from ..chat_template import ChatTemplate
from ..errors import BackendError, InvalidRequest, ServerUnavailable, UnsupportedFeature
from .base import OnText

_DEFAULTS = SamplingParams()
_CONSTRAINTS = ("regex", "json_schema")  # sent as their own fields (see _request_for)


def _openai_names() -> dict[str, str]:
    """SamplingParams option -> its OpenAI request field (the first: max_tokens, not
    max_completion_tokens)."""
    names: dict[str, str] = {}
    for model in (CompletionRequest, ChatCompletionRequest):
        for name, option in sampling_names(model).items():
            names.setdefault(option, name)
    return names


_OPENAI_NAMES = _openai_names()


class OpenAI:
    """`rf.OpenAI(model, base_url=..., api_key=...)`; api_key defaults to $OPENAI_API_KEY."""

    needs_messages = True

    def __init__(self, model: str, *, base_url: str = "https://api.openai.com/v1",
                 api_key: str | None = None, timeout: float | None = 600.0):
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = timeout
        self.model_info = {"model_path": model}
        self.chat_template = ChatTemplate(None)  # roles travel as messages, not as text

    def __repr__(self) -> str:
        return f"OpenAI({self.model!r}, base_url={self.base_url!r})"

    # ---- backend protocol ----

    def generate_from_body(self, body: dict) -> dict | Iterator[dict]:
        if body.get("return_logprob") or isinstance(body.get("text"), list) or "input_ids" in body:
            raise UnsupportedFeature("the OpenAI backend cannot return prompt log-probabilities "
                                     "or run batched / token-id prompts")
        path, request = self._request_for(body)
        chat = path.endswith("chat/completions")
        if body.get("stream"):
            return self._stream(path, {**request, "stream": True}, chat=chat)
        resp = self._post(path, request)
        if request.get("n", 1) > 1:  # one native response per choice, as /generate answers n
            return [_native({**resp, "choices": [c]}, chat=chat) for c in resp["choices"]]
        return _native(resp, chat=chat)

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        executor = ProgramExecutor(self.generate_from_body, stream=stream, on_text=on_text,
                                   keep_exceptions=True, select=self._select, with_messages=True)
        return executor.run(program)

    def cache_prefix(self, text: str) -> None:
        """Remote APIs cache prefixes on their own (or not); nothing to send."""

    def shutdown(self) -> None:
        pass

    # ---- translation ----

    def _request_for(self, body: dict) -> tuple[str, dict]:
        sp = body.get("sampling_params") or {}
        request: dict[str, Any] = {"model": self.model, **openai_sampling(sp)}
        if sp.get("json_schema"):
            request["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": json.loads(sp["json_schema"]), "strict": True}}
        if sp.get("regex"):
            request["regex"] = sp["regex"]
        messages = body.get("messages") or []
        if not messages:
            return "/completions", {**request, "prompt": body["text"]}
        if body.get("in_open_role") != "assistant":
            raise UnsupportedFeature("with the OpenAI backend a program that uses roles must put "
                                     "every gen inside an assistant turn")
        *closed, current = messages
        if current["content"]:  # continue a started assistant message (vLLM/SGLang/radixflow)
            request.update(continue_final_message=True, add_generation_prompt=False)
            return "/chat/completions", {**request, "messages": messages}
        return "/chat/completions", {**request, "messages": closed}

    def _select(self, prompt: str, choices: list[str], method: str, *,
                messages: list | None = None,
                in_open_role: str | None = None) -> tuple[int, dict, int]:
        regex = "(" + "|".join(re.escape(c) for c in choices) + ")"
        body = {"text": prompt, "messages": messages, "in_open_role": in_open_role,
                "sampling_params": {"max_new_tokens": max(len(c) for c in choices) + 8,
                                    "temperature": 0, "regex": regex}}
        out = self.generate_from_body(body)["text"]
        matches = [i for i, c in enumerate(choices) if out.strip() == c or out.startswith(c)]
        if not matches:
            raise UnsupportedFeature(f"select over the OpenAI backend: the model answered {out!r}, "
                                     f"not one of {choices} (does the server support `regex`?)")
        best = max(matches, key=lambda i: len(choices[i]))
        meta = {"method": "constrained_generation", "choices": list(choices),
                "scores": [1.0 if i == best else None for i in range(len(choices))]}
        return best, meta, 1

    # ---- HTTP ----

    def _send(self, path: str, request: dict, *, stream: bool = False):
        import requests

        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = self.base_url + path
        try:
            resp = requests.post(url, data=json.dumps(request), headers=headers, stream=stream,
                                 timeout=(10.0, self.timeout))
        except requests.ConnectionError as exc:
            raise ServerUnavailable(f"cannot reach the OpenAI-compatible API at {self.base_url}: "
                                    f"{type(exc).__name__}") from exc
        if resp.status_code != 200:
            try:
                message = resp.json().get("error", {}).get("message") or resp.text[:300]
            except ValueError:
                message = resp.text[:300]
            if resp.status_code == 400:
                raise InvalidRequest(f"{message} (from {url})")
            raise BackendError(message, status_code=resp.status_code, url=url)
        return resp

    def _post(self, path: str, request: dict) -> dict:
        return self._send(path, request).json()

    def _stream(self, path: str, request: dict, *, chat: bool) -> Iterator[dict]:
        resp = self._send(path, request, stream=True)
        text, finish = "", None
        with resp:
            for line in resp.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if not chunk.get("choices"):
                    continue
                choice = chunk["choices"][0]
                delta = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                text += delta or ""
                finish = choice.get("finish_reason") or finish
                yield {"text": text, "meta_info": {"finish_reason": _finish(finish)}}


def openai_sampling(sp: dict) -> dict[str, Any]:
    """The OpenAI request fields of native sampling options (constraints aside): max_tokens
    always, any other option only when it differs from its default."""
    request: dict[str, Any] = {"max_tokens": sp.get("max_new_tokens", _DEFAULTS.max_new_tokens)}
    for key, value in sp.items():
        if (key in _CONSTRAINTS or key == "max_new_tokens" or value is None
                or value == getattr(_DEFAULTS, key, None)):
            continue
        name = _OPENAI_NAMES.get(key)
        if name is None:
            raise UnsupportedFeature(f"{key} is not an OpenAI API field: use a radixflow "
                                     f"backend (rf.Endpoint, rf.Runtime, rf.Engine)")
        request[name] = value
    return request


def _finish(reason: str | None) -> dict | None:
    if reason is None:
        return None
    return {"type": "length" if reason == "length" else "stop"}


def _native(resp: dict, *, chat: bool) -> dict:
    choice = resp["choices"][0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    usage = resp.get("usage") or {}
    return {"text": text or "", "meta_info": {
        "id": resp.get("id"), "finish_reason": _finish(choice.get("finish_reason")),
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "reasoning_text": (choice.get("message") or {}).get("reasoning_content")}}
