"""The backend protocol, and what the backends that run programs in this process share.

A backend turns native /generate bodies into native responses, runs /program stretches, and
knows the model's chat template. Endpoint (HTTP), Runtime (a local server), Engine
(in-process) and OpenAI (remote OpenAI-compatible APIs) implement it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from radixflow.runtime.program import ProgramExecutor

from ..chat_template import ChatTemplate

OnText = Callable[[Any, str], None]


@runtime_checkable
class Backend(Protocol):
    chat_template: ChatTemplate
    model_info: dict

    def generate(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        """One native /generate call (an iterator of events when body["stream"] is true)."""

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        """Run a /program body; the /program response (radixflow.runtime.program.wire)."""

    def cache_prefix(self, text: str) -> None:
        """Prefill `text` into the server's prefix cache without generating."""

    def shutdown(self) -> None:
        """Release what the backend owns (a server process, an engine)."""


def run_locally(backend: Any, program: dict, *, stream: bool = False,
                on_text: OnText | None = None) -> dict:
    """Execute a /program body in this process over `backend.generate`."""
    executor = ProgramExecutor(backend.generate, stream=stream, on_text=on_text,
                               keep_exceptions=True)
    return executor.run(program)


def prefill_only(text: str) -> dict:
    """The native body that caches `text` and generates nothing (SGLang's warm-up request)."""
    return {"text": text, "sampling_params": {"max_new_tokens": 0}}
