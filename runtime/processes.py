"""Process plumbing shared by every radixflow process: logging, dying with the parent,
signals, and the children a launcher starts and stops together.

Used by `radixflow serve` (server/launch.py and its scheduler, detokenizer and TP-rank
children), Engine's TP workers (distributed/worker.py) and `radixflow router`.

Rules: a child dies with its parent (PR_SET_PDEATHSIG plus a watcher thread); Ctrl-C
reaches the parent only, which decides when its children stop; SIGTERM stops a child at once
(`fast_exit`) and a parent like Ctrl-C (`stop_on_sigterm`).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ServerUnavailable

logger = logging.getLogger(__name__)

CHILD_STOP_TIMEOUT_S = 5.0


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, force=True,
        format="%(asctime)s %(processName)s %(levelname)s %(name)s: %(message)s")


def fast_exit(code: int) -> None:
    """Exit now, skipping interpreter teardown: with torch and transformers loaded, its
    garbage collection takes seconds, and there is nothing left to clean up."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM stops this process like Ctrl-C (until uvicorn, once serving, takes the
    signals over and re-raises the one it shut down for)."""
    signal.signal(signal.SIGTERM, raise_keyboard_interrupt)


def set_parent_death_signal() -> None:
    """Linux: the kernel kills this process when its parent dies (no-op elsewhere)."""
    if sys.platform != "linux":
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        logger.debug("prctl(PR_SET_PDEATHSIG) unavailable; relying on the watcher thread")


def watch_parent(parent_pid: int, on_gone: Callable[[], None], interval: float = 0.5) -> None:
    """Call on_gone (once) from a daemon thread when parent_pid is no longer our parent."""

    def loop() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        on_gone()

    threading.Thread(target=loop, name="parent-watch", daemon=True).start()


def become_child(parent_pid: int, log_level: str) -> None:
    """Set up a child process: no orphans, quiet Ctrl-C, SIGTERM exits cleanly."""
    set_parent_death_signal()
    watch_parent(parent_pid, lambda: os._exit(1))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    signal.signal(signal.SIGTERM, lambda *_: fast_exit(0))
    setup_logging(log_level)


def resolve_entry(entry: str) -> Callable[..., Any]:
    """The function named by "package.module:function"."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def child_main(entry: str, log_level: str, parent_pid: int, *args: Any, **kwargs: Any) -> None:
    """Every child that Children starts runs here, then entry(*args, **kwargs)."""
    become_child(parent_pid, log_level)
    resolve_entry(entry)(*args, **kwargs)


@dataclass
class Children:
    """A launcher's child processes, started and stopped together."""

    log_level: str
    procs: dict[str, mp.process.BaseProcess] = field(default_factory=dict)

    def start(self, name: str, entry: str, *args: Any, **kwargs: Any) -> Any:
        """Start a child running entry(*args, ready_conn, **kwargs); return the parent's end."""
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=child_main, name=name, kwargs=kwargs,
                           args=(entry, self.log_level, os.getpid(), *args, child_conn))
        proc.start()
        child_conn.close()
        self.procs[name] = proc
        return parent_conn

    def wait_ready(self, name: str, conn: Any, on_progress: Callable[[dict], None] | None = None
                   ) -> Any:
        """The child's ready message; raise ServerUnavailable if it dies or reports an error.

        A child may send progress dicts ({"progress": done, "total": n}) before it is ready.
        """
        proc = self.procs[name]
        while True:
            if conn.poll(0.1):
                try:
                    msg = conn.recv()
                except EOFError:
                    msg = None
                if isinstance(msg, dict) and "progress" in msg:
                    if on_progress is not None:
                        on_progress(msg)
                    continue
                if isinstance(msg, dict) and msg.get("ok") is False:
                    raise ServerUnavailable(f"the {name} process failed to start: "
                                            f"{msg.get('error')}")
                if isinstance(msg, dict) and "model_info" in msg:
                    return msg["model_info"]
                if msg is not None:
                    return msg
            if not proc.is_alive():
                proc.join()
                raise ServerUnavailable(f"the {name} process exited during start-up "
                                        f"(exit code {proc.exitcode}); see the log above")

    def dead(self) -> tuple[str, int | None] | None:
        """(name, exit code) of a child that has exited, if any."""
        for name, proc in self.procs.items():
            if not proc.is_alive():
                return name, proc.exitcode
        return None

    def stop(self) -> None:
        """SIGTERM every child; SIGKILL those still alive after CHILD_STOP_TIMEOUT_S."""
        logger.debug("stopping %s", ", ".join(self.procs) or "no children")
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
        for name, proc in self.procs.items():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                logger.warning("the %s process did not stop in time; killing it", name)
                proc.kill()
                proc.join()
        logger.debug("children stopped")
