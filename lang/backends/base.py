"""The backend protocol and the process-wide default backend.

A backend turns native /generate bodies into native responses, runs /program stretches, and
knows the model's chat template. Endpoint (HTTP), Runtime (a local server), Engine
(in-process) and OpenAI (remote OpenAI-compatible APIs) implement it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

from ..chat_template import ChatTemplate
from ..errors import NoBackendError
from ..program import ProgramExecutor

OnText = Callable[[Any, str], None]


@runtime_checkable
class Backend(Protocol):
    chat_template: ChatTemplate
    model_info: dict

    def generate(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        """One native /generate call (an iterator of events when body["stream"] is true)."""

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        """Run a /program body; the /program response (program.py)."""

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


_default: Backend | None = None
_default_lock = threading.Lock()


def as_backend(obj: Any) -> Backend:
    """`obj` as a backend: a backend as is, a URL as an Endpoint, a runtime Engine wrapped."""
    if isinstance(obj, str):
        from .endpoint import Endpoint

        return Endpoint(obj)
    if hasattr(obj, "run_program") and hasattr(obj, "chat_template"):
        return obj
    if hasattr(obj, "generate") and hasattr(obj, "tokenizer"):  # radixflow.runtime.engine.Engine
        from .engine import Engine

        return Engine(engine=obj)
    raise TypeError(f"not a backend: {obj!r:.80} (use rf.Endpoint(url), rf.Runtime(), "
                    f"rf.Engine() or rf.OpenAI(model))")


def set_default_backend(backend: Any) -> None:
    """Make `backend` (or a URL, or a runtime Engine) the backend of runs that name none."""
    global _default
    with _default_lock:
        _default = None if backend is None else as_backend(backend)


def get_default_backend() -> Backend:
    if _default is None:
        raise NoBackendError("no backend: pass backend=... or call "
                             "rf.set_default_backend(rf.Endpoint('http://127.0.0.1:30000'))")
    return _default
