"""Pure-Python work (a Jinja render) stopped at a deadline, in the thread that runs it.

A thread cannot be killed, but pure-Python code can be interrupted: past the deadline a
timer thread raises `DeadlineExceeded` inside the worker (CPython's PyThreadState_SetAsyncExc),
at its next bytecode boundary. Only for code whose state an exception anywhere cannot corrupt
(a render of a template); a C call holding the GIL is interrupted when it returns.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(BaseException):  # noqa: N818 -- BaseException: `except Exception` in the
    """Raised inside the worker at the deadline."""  # interrupted code must not swallow it


class TimedOut(Exception):  # noqa: N818
    """`run_with_deadline`'s answer when `fn` ran past its deadline."""


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> int:
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None)


def run_with_deadline(fn: Callable[[], T], seconds: float) -> T:
    """`fn()` in this thread, interrupted after `seconds`: then TimedOut is raised."""
    thread_id = threading.get_ident()
    lock = threading.Lock()
    state = {"running": True, "fired": False}

    def fire() -> None:
        with lock:
            if state["running"]:
                state["fired"] = True
                _raise_in(thread_id, DeadlineExceeded)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        try:
            result = fn()
        finally:
            with lock:
                state["running"] = False
                if state["fired"]:
                    _raise_in(thread_id, None)  # one still pending: cleared
            timer.cancel()
    except DeadlineExceeded:
        raise TimedOut(f"stopped after {seconds:g} s") from None
    if state["fired"]:  # fired just as fn returned: the answer came too late all the same
        raise TimedOut(f"stopped after {seconds:g} s")
    return result
