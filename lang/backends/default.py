"""The process-wide default backend, and turning what users pass as `backend=` into one."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import NoBackendError
from .base import Backend
from .endpoint import Endpoint

_default: Backend | None = None
_default_lock = threading.Lock()


def as_backend(obj: Any) -> Backend:
    """`obj` as a backend: a backend (rf.Engine, rf.Runtime, ...) as is, a URL as an Endpoint."""
    if isinstance(obj, str):
        return Endpoint(obj)
    if isinstance(obj, Backend):
        return obj
    raise TypeError(f"not a backend: {obj!r:.80} (use rf.Endpoint(url), rf.Runtime(), "
                    f"rf.Engine() or rf.OpenAI(model))")


def set_default_backend(backend: Any) -> None:
    """Make `backend` (or a URL) the backend of runs that name none."""
    global _default
    with _default_lock:
        _default = None if backend is None else as_backend(backend)


def get_default_backend() -> Backend:
    if _default is None:
        raise NoBackendError("no backend: pass backend=... or call "
                             "rf.set_default_backend(rf.Endpoint('http://127.0.0.1:30000'))")
    return _default
