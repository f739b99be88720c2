"""runtime/processes.py on its own (tests/runtime/server/test_lifecycle.py and test_process_tree.py
run it with real servers)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from radixflow.runtime.processes import resolve_entry, stop_on_sigterm, watch_parent


def test_watch_parent_calls_back_once_the_parent_is_not_ours():
    gone = threading.Event()
    watch_parent(os.getppid() + 1_000_000, gone.set, interval=0.01)  # never our parent
    assert gone.wait(5)


def test_resolve_entry():
    assert resolve_entry("os.path:join") is os.path.join


def test_sigterm_stops_like_ctrl_c():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # (interrupted: the handler runs at once)
    finally:
        signal.signal(signal.SIGTERM, previous)
