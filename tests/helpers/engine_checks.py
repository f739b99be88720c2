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
def grammar_flag(engine, name: str, enabled: bool):
    """Requests submitted inside get (or not) the scheduler's `name` grammar feature
    (jump_forward, budget_safe); the flag is read per request."""
    grammars = engine.scheduler.grammars
    before = getattr(grammars, name)
    setattr(grammars, name, enabled)
    try:
        yield
    finally:
        setattr(grammars, name, before)


def jump_forward(engine, enabled: bool):
    return grammar_flag(engine, "jump_forward", enabled)
