"""Engine: radixflow's runtime in this process (no server, no HTTP)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..chat_template import ChatTemplate
from .base import OnText, prefill_only, run_locally

_BODY_KEYS = ("text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
              "top_logprobs_num", "return_text_in_logprobs", "stream")


class Engine:
    """An in-process backend.

    `rf.Engine(model=None, **server_args)` starts `radixflow.runtime.engine.Engine` (ServerArgs
    fields as keywords; model None is the default SmolLM2-135M-Instruct). `rf.Engine(engine=e)`
    wraps an engine you already have (then `shutdown` leaves it running).
    """

    def __init__(self, model: str | None = None, *, engine: Any = None, **server_args: Any):
        if engine is None:
            from radixflow.runtime.engine import Engine as RuntimeEngine

            engine = RuntimeEngine(model=model, **server_args)
            self._owns_engine = True
        else:
            self._owns_engine = False
        self.engine = engine
        self.model_info: dict = dict(getattr(engine, "model_info", {}) or {})
        self.chat_template = ChatTemplate.from_tokenizer(engine.tokenizer)

    def __repr__(self) -> str:
        return f"Engine(model={self.model_info.get('model_path')!r})"

    def generate(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        body = {k: body[k] for k in _BODY_KEYS if body.get(k) is not None}
        if hasattr(self.engine, "generate_from_body"):
            return self.engine.generate_from_body(body)
        return self.engine.generate(**body)

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        return run_locally(self, program, stream=stream, on_text=on_text)

    def cache_prefix(self, text: str) -> None:
        self.generate(prefill_only(text))

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def shutdown(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
