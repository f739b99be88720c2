"""A scripted stand-in for a radixflow server, for DSL tests that need no model.

It speaks the native /generate shapes (protocol doc sections 3-5) over a character-level
"tokenizer" (one token per character, id = ord), so logprob windows are exact: the output
of a gen comes from `respond(prompt, sampling_params)`, and the log-probability of character
c after a prefix comes from `logprob(prefix, c)`. Every body it receives is recorded.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from radixflow.chat_template import ChatTemplate
from radixflow.runtime.program import run_program_locally

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_respond(prompt: str, sampling_params: dict) -> str:
    return " answer"


def default_logprob(prefix: str, char: str) -> float:
    return -1.0


class FakeBackend:
    def __init__(self, respond: Callable[[str, dict], str] = default_respond,
                 logprob: Callable[[str, str], float] = default_logprob, *,
                 template: str | None = CHATML, fail_on: Callable[[dict], bool] | None = None):
        self.respond = respond
        self.logprob = logprob
        self.fail_on = fail_on
        self.chat_template = ChatTemplate(template)
        self.model_info = {"model_path": "fake"}
        self.calls: list[dict] = []
        self.programs: list[dict] = []
        self.prefixes: list[str] = []
        self._lock = threading.Lock()

    # ---- backend protocol ----

    def generate_from_body(self, body: dict) -> Any:
        with self._lock:
            self.calls.append(body)
        if self.fail_on is not None and self.fail_on(body):
            raise RuntimeError(f"scripted failure for {str(body.get('text'))[-30:]!r}")
        key = "text" if body.get("text") is not None else "input_ids"
        prompts = body[key]
        if isinstance(prompts, list) and (not prompts or not isinstance(prompts[0], int)):
            return [self._one({**body, key: p}) for p in prompts]
        if body.get("stream"):
            return self._stream(body)
        return self._one(body)

    def run_program(self, program: dict, *, stream: bool = False, on_text=None) -> dict:
        with self._lock:
            self.programs.append(program)
        return run_program_locally(self.generate_from_body, program, stream=stream,
                                   on_text=on_text)

    def cache_prefix(self, text: str) -> None:
        self.prefixes.append(text)
        self.generate_from_body({"text": text, "sampling_params": {"max_new_tokens": 0}})

    def shutdown(self) -> None:
        pass

    # ---- the fake model ----

    def _prompt(self, body: dict) -> str:
        if body.get("input_ids") is not None:
            return "".join(chr(i) for i in body["input_ids"])
        return body["text"]

    def _one(self, body: dict) -> dict:
        prompt = self._prompt(body)
        sp = body.get("sampling_params") or {}
        max_new = sp.get("max_new_tokens", 128)
        out = self.respond(prompt, sp)[:max_new] if max_new else ""
        finish: dict = {"type": "length", "length": max_new}
        stops = sp.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        cuts = [(out.find(s), s) for s in stops if s in out]
        if cuts:
            pos, matched = min(cuts)
            out, finish = out[:pos], {"type": "stop", "matched": matched}
        if sp.get("regex") and not re.fullmatch(sp["regex"], out):
            raise AssertionError(f"fake model output {out!r} does not match {sp['regex']!r}")
        meta: dict = {"id": "fake", "prompt_tokens": len(prompt), "completion_tokens": len(out),
                      "cached_tokens": 0, "finish_reason": finish}
        if body.get("return_logprob"):
            start = body.get("logprob_start_len") or 0
            entries = []
            for pos in range(start, len(prompt)):
                lp = None if pos == start else self.logprob(prompt[:pos], prompt[pos])
                text = prompt[pos] if body.get("return_text_in_logprobs") else None
                entries.append([lp, ord(prompt[pos]), text])
            meta["input_token_logprobs"] = entries
            meta["output_token_logprobs"] = [[-0.5, ord(c), None] for c in out]
        return {"text": out, "output_ids": [ord(c) for c in out], "meta_info": meta}

    def _stream(self, body: dict) -> Iterator[dict]:
        full = self._one({**body, "stream": False})
        out = full["text"]
        for i in range(1, len(out) + 1):
            last = i == len(out)
            meta = {**full["meta_info"], "completion_tokens": i,
                    "finish_reason": full["meta_info"]["finish_reason"] if last else None}
            yield {"text": out[:i], "meta_info": meta}
        if not out:
            yield full
