"""When and where a request runs: its `priority`, `cache_salt` and `routed_dp_rank`, checked
at the front door for /generate and the OpenAI routes alike, into GenerateReq's fields.

The scheduler side is docs/server-api.md, "Priority and `cache_salt`"; SchedulerClient.submit
checks that a routed_dp_rank names a replica.
"""

from __future__ import annotations

from typing import Any

from .errors import InvalidRequest

MAX_CACHE_SALT_CHARS = 1024  # vLLM's bound (its docs suggest 43 characters of base64)
INT64 = 1 << 63


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_priority(value: Any, enabled: bool, *, zero_ok: bool = False) -> int | None:
    """A request's priority (None: unset). Set without --enable-priority-scheduling it is a
    400 naming the flag; `zero_ok` (vLLM's rule, the OpenAI routes): 0, the default, is
    accepted without it."""
    if value is None:
        return None
    if not _is_int(value) or not -INT64 <= value < INT64:
        raise InvalidRequest(f"priority must be a 64-bit int (got {value!r})", param="priority")
    if not enabled and not (zero_ok and value == 0):
        raise InvalidRequest("priority needs a server started with "
                             "--enable-priority-scheduling", param="priority")
    return value


def check_cache_salt(value: Any, *, empty_ok: bool = True) -> str | None:
    """A request's cache_salt (None: unset): a string of at most MAX_CACHE_SALT_CHARS. An
    empty one is unset (SGLang), or a 400 where `empty_ok` is false (vLLM). The salt itself
    is never echoed in an error."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"cache_salt must be a string (got a {type(value).__name__})",
                             param="cache_salt")
    if not value:
        if empty_ok:
            return None
        raise InvalidRequest("cache_salt must not be empty", param="cache_salt")
    if len(value) > MAX_CACHE_SALT_CHARS:
        raise InvalidRequest(f"cache_salt has {len(value)} characters; the limit is "
                             f"{MAX_CACHE_SALT_CHARS}", param="cache_salt")
    return value


def check_dp_rank(value: Any, alias: Any = None) -> int | None:
    """routed_dp_rank, or SGLang's deprecated `data_parallel_rank` (`alias`); the range is
    SchedulerClient.submit's to check (it knows the replicas)."""
    if alias is not None:
        if value is not None and value != alias:
            raise InvalidRequest("routed_dp_rank and data_parallel_rank (its deprecated name) "
                                 "differ; give one", param="data_parallel_rank")
        value = alias
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise InvalidRequest(f"routed_dp_rank must be an int >= 0 (got {value!r})",
                             param="routed_dp_rank")
    return value


def placement(fields: Any, *, priority_scheduling: bool, openai: bool = False) -> dict:
    """GenerateReq's priority / cache_salt / routed_dp_rank from `fields` (a /generate body,
    or an OpenAI request model: `openai` applies vLLM's rules for 0 and "")."""
    get = fields.get if isinstance(fields, dict) else (lambda k: getattr(fields, k, None))
    return {"priority": check_priority(get("priority"), priority_scheduling, zero_ok=openai),
            "cache_salt": check_cache_salt(get("cache_salt"), empty_ok=not openai),
            "routed_dp_rank": check_dp_rank(get("routed_dp_rank"), get("data_parallel_rank"))}
