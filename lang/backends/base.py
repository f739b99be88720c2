"""The backend protocol.

A backend turns native /generate bodies into native responses, runs /program stretches, and
reports its model (`model_info`, with the chat template when it has one). Endpoint (HTTP),
Runtime (a local server), radixflow.Engine (in-process, defined in the runtime) and OpenAI
(remote OpenAI-compatible APIs) implement it. A backend may carry its own `chat_template`
(a ChatTemplate); otherwise programs render roles with the one its model_info reports.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from radixflow.runtime.program.executor import OnText

__all__ = ["Backend", "OnText"]


@runtime_checkable
class Backend(Protocol):
    model_info: dict

    def generate_from_body(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        """One native /generate call (an iterator of events when body["stream"] is true)."""

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        """Run a /program body; the /program response (radixflow.runtime.program.wire)."""

    def cache_prefix(self, text: str) -> None:
        """Prefill `text` into the server's prefix cache without generating."""

    def shutdown(self) -> None:
        """Release what the backend owns (a server process, an engine)."""

