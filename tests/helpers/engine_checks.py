"""Checks shared by tests that drive an in-process Engine."""

from __future__ import annotations

import contextlib
import time


def settle(engine) -> None:
    """Wait for the scheduler thread to go idle, then check the KV slot invariant."""
    for _ in range(500):
        if engine.scheduler.is_idle:
            break
        time.sleep(0.01)
    engine.scheduler.check_slots()


@contextlib.contextmanager
def jump_forward(engine, enabled: bool):
    """Requests submitted inside get (or not) jump-forward; the flag is read per request."""
    grammars = engine.scheduler.grammars
    before, grammars.jump_forward = grammars.jump_forward, enabled
    try:
        yield
    finally:
        grammars.jump_forward = before
