"""What every route handler starts from: the server's state (on `app.state`) and the
request's JSON body."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Request

from ..errors import InvalidRequest
from ..server_args import ServerArgs
from .metrics import Metrics
from .scheduler_client import SchedulerClient


@dataclass
class ServerState:
    args: ServerArgs
    client: SchedulerClient
    served_model_name: str
    metrics: Metrics | None = None
    processes: dict[str, int] = field(default_factory=dict)  # name -> pid, for server_info
    tool_parser: Any = None  # the tool-call format (tool_parsers.ToolParser); set by create_app
    # NOTE: a program thread blocks while its generations run, so the pool must allow as many
    # programs as the scheduler can batch (asyncio's default pool has cpu_count + 4 threads).
    program_pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.program_pool = ThreadPoolExecutor(max(self.args.max_running_requests, 8),
                                               thread_name_prefix="program")

    @property
    def served_model_names(self) -> list[str]:
        """Every name given with --served-model-name, the reported one first."""
        return list(dict.fromkeys([self.served_model_name, *self.args.served_model_names]))

    @property
    def model_names(self) -> set[str]:
        """The names a request's `model` may give: a served name or the model path."""
        return {*self.served_model_names, str(self.client.model_info.get("model_path"))}


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw:
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
