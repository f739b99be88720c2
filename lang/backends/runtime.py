"""Runtime: start a local `radixflow serve` and talk to it like an Endpoint."""

from __future__ import annotations

from typing import Any

from .endpoint import Endpoint


class Runtime(Endpoint):
    """A radixflow server started in a subprocess for this program.

    `rf.Runtime(model=None, **server_args)` takes ServerArgs fields (model None is the default
    SmolLM2-135M-Instruct) and waits until the server is ready. `shutdown()` (or leaving a
    `with` block) stops it.
    """

    def __init__(self, model: str | None = None, **server_args: Any):
        from radixflow.runtime.server.runtime import Runtime as ServerRuntime

        self.server = ServerRuntime(model=model, **server_args)
        try:
            super().__init__(self.server.url, api_key=server_args.get("api_key"))
        except BaseException:
            self.server.shutdown()
            raise

    def shutdown(self) -> None:
        super().shutdown()
        self.server.shutdown()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
