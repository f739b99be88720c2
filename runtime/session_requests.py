"""Session requests of the native API: a /generate body's `session_params`, and the
/open_session and /close_session bodies, as the scheduler's messages.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import InvalidRequest
from .messages import CloseSessionReq, OpenSessionReq, SessionParams
from .native_fields import is_int
from .request_building import new_rid

SESSION_PARAMS_KEYS = ("id", "rid", "offset", "replace", "drop_previous_output")


def parse_session_params(value: Any) -> SessionParams | None:
    """A /generate body's `session_params` (SGLang's SessionParams); None when it names no
    session: absent, or an `id` of null (SGLang serves that as a request outside any session).
    Whether the session and `rid` exist is the scheduler's to say."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("session_params must be an object", param="session_params")
    unknown = [k for k in value if k not in SESSION_PARAMS_KEYS]
    if unknown:
        raise InvalidRequest(f"unknown session parameter {unknown[0]!r}; session_params takes "
                             f"{', '.join(SESSION_PARAMS_KEYS)}",
                             param=f"session_params.{unknown[0]}")
    sid, rid, offset = value.get("id"), value.get("rid"), value.get("offset")
    if sid is None:
        return None
    if not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_params.id must be a session id (a non-empty string) "
                             f"(got {sid!r})", param="session_params.id")
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise InvalidRequest(f"session_params.rid must be the rid of a request of the session "
                             f"(a non-empty string) or null (got {rid!r})",
                             param="session_params.rid")
    if offset is not None and not is_int(offset):
        raise InvalidRequest(f"session_params.offset must be an int or null (got {offset!r})",
                             param="session_params.offset")
    flags = {}
    for key in ("replace", "drop_previous_output"):
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise InvalidRequest(f"session_params.{key} must be a boolean (got {flag!r})",
                                 param=f"session_params.{key}")
        flags[key] = bool(flag)
    return SessionParams(id=sid, rid=rid, offset=offset, **flags)


def parse_open_session(body: Any) -> OpenSessionReq:
    """An /open_session body (SGLang's OpenSessionReqInput: capacity_of_str_len, session_id,
    timeout, streaming) as the scheduler's message; a session id is made up when none is given.
    Unknown keys are ignored, as in /generate."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    capacity = body.get("capacity_of_str_len")
    if not is_int(capacity) or capacity < 1:
        raise InvalidRequest(f"capacity_of_str_len must be an int >= 1: the most tokens one "
                             f"request of the session may hold, history included (got "
                             f"{capacity!r})", param="capacity_of_str_len")
    sid = body.get("session_id")
    if sid is None:
        sid = new_rid()
    elif not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_id must be a non-empty string or null (got {sid!r})",
                             param="session_id")
    timeout = body.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout < math.inf):
        raise InvalidRequest(f"timeout must be a number of seconds > 0 or null (got "
                             f"{timeout!r})", param="timeout")
    streaming = body.get("streaming")
    if streaming is not None and not isinstance(streaming, bool):
        raise InvalidRequest(f"streaming must be a boolean (got {streaming!r})",
                             param="streaming")
    if streaming:
        raise InvalidRequest("streaming sessions (which keep the last request's KV for the next "
                             "one) are not supported; open a session without 'streaming': its "
                             "history's KV is reused from the prefix cache", param="streaming")
    return OpenSessionReq(session_id=sid, capacity_of_str_len=capacity,
                          timeout=None if timeout is None else float(timeout))


def parse_close_session(body: Any) -> CloseSessionReq:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    sid = body.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_id must be a non-empty string (got {sid!r})",
                             param="session_id")
    return CloseSessionReq(session_id=sid)
