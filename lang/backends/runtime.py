"""Runtime: start a local `radixflow serve` and talk to it like an Endpoint."""

from __future__ import annotations

from typing import Any

from .endpoint import Endpoint


class Runtime(Endpoint):
    """A radixflow server started in a subprocess for this program (`radixflow.Runtime`).

    `Runtime(model_path=None, **server_args)` takes ServerArgs fields (`model=` is the same as
    `model_path=`; None is the default SmolLM2-135M-Instruct) and waits until the server is
    ready. It takes SGLang's calls (`generate(prompt, sampling_params, ...)`, `async_generate`)
    and runs programs (`rf.set_default_backend(runtime)`). `shutdown()` (or leaving a `with`
    block) stops it; `url` is the server's address for any other client.
    """

    def __init__(self, model_path: str | None = None, **server_args: Any):
        from radixflow.runtime.server.process import ServerProcess

        self.server = ServerProcess(model_path, **server_args)
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
