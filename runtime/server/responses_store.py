"""The stored responses of /v1/responses: what previous_response_id, retrieve, cancel, delete
and input_items read.

Bounded twice: at most --max-stored-responses records and MAX_STORED_BYTES of them (their JSON
size); past either the least recently used go first. Lives on the event loop (no locks).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import RadixflowError

MAX_STORED_BYTES = 256 << 20  # of all records together


class ResponseNotFound(RadixflowError):
    status_code = 404

    def __init__(self, response_id: str, param: str | None = None):
        super().__init__(f"Response with id {response_id!r} not found.")
        self.param = param


@dataclass
class Stored:
    """One response: its object, the items it was made from, and (while it runs) its rids."""

    response: dict[str, Any]
    items: list[dict[str, Any]]
    rids: list[str] = field(default_factory=list)
    cancelled: bool = False
    size: int = 0

    @property
    def running(self) -> bool:
        return self.response["status"] in ("queued", "in_progress")


class ResponseStore:
    def __init__(self, max_records: int, max_bytes: int = MAX_STORED_BYTES):
        self.max_records, self.max_bytes = max_records, max_bytes
        self._records: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._records

    def put(self, record: Stored) -> None:
        """Keep (or replace) `record` under its response's id, evicting the oldest past the
        bounds; a record bigger than the whole byte budget is not kept."""
        rid = record.response["id"]
        self.pop(rid)
        record.size = len(orjson.dumps(record.response)) + len(orjson.dumps(record.items))
        if record.size > self.max_bytes:
            return
        self._records[rid] = record
        self.bytes += record.size
        while len(self._records) > self.max_records or self.bytes > self.max_bytes:
            self.pop(next(iter(self._records)))

    def get(self, response_id: str, param: str | None = None) -> Stored:
        """The record, now the most recently used; ResponseNotFound (404) if none."""
        record = self._records.get(response_id)
        if record is None:
            raise ResponseNotFound(response_id, param)
        self._records.move_to_end(response_id)
        return record

    def pop(self, response_id: str) -> Stored | None:
        record = self._records.pop(response_id, None)
        if record is not None:
            self.bytes -= record.size
        return record


def response_store(app_state: Any, max_records: int) -> ResponseStore:
    """The app's store, made on first use."""
    store = getattr(app_state, "responses_store", None)
    if store is None:
        store = app_state.responses_store = ResponseStore(max_records)
    return store
