"""Start and inspect a real `radixflow serve` subprocess in tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from radixflow.runtime.server.process import free_port


def own_cache(dest: Path) -> Path:
    """An empty radixflow cache (for RADIXFLOW_CACHE) but for the compiled kernels, which it
    shares with the default cache (built there once, not again here)."""
    from radixflow.kernels.cpu import build

    kernels = build.cache_dir()
    kernels.mkdir(parents=True, exist_ok=True)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "kernels").symlink_to(kernels, target_is_directory=True)
    return dest


def maps_torch(pid: int) -> bool:
    """Whether the process has libtorch loaded."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def descendants(pid: int) -> set[int]:
    """Every live process below pid (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                continue
            for k in map(int, kids):
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout: float = 30.0) -> set[int]:
    """The pids still alive after waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {p for p in pids if is_alive(p)}
        if not alive:
            return alive
        time.sleep(0.1)
    return {p for p in pids if is_alive(p)}


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float) -> bool:
    """Poll `url`/health until it answers 200 (True) or `timeout` passes (False); raises
    RuntimeError if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.2)
    return False


class LiveServer:
    """`radixflow serve <flags>` on a free port; `stop()` sends SIGTERM and returns the code."""

    def __init__(self, *flags: str, log_path: Path, timeout: float = 300.0,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 -- closed in stop()
        cmd = [sys.executable, "-m", "radixflow.runtime.cli", "serve", "--port", str(self.port),
               *flags]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        try:
            if wait_healthy(self.proc, self.url, timeout):
                return
        except RuntimeError as exc:
            raise RuntimeError(f"server: {exc}:\n{self.log()}") from None
        self.proc.kill()
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def children(self) -> set[int]:
        return descendants(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def kill_all(pids: set[int]) -> None:
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def server_info(server) -> dict:
    return requests.get(server.url + "/get_server_info", timeout=30).json()


def wait_idle(server, timeout: float = 60.0) -> dict:
    """Server info once the scheduler reports (in fresh stats) nothing running and no KV held
    by requests; fails the test if that does not happen within timeout."""
    t0 = time.time()
    deadline = time.monotonic() + timeout
    info: dict = {}
    while time.monotonic() < deadline:
        info = server_info(server)
        fresh = info.get("stats_time", 0) > t0
        if (fresh and info["num_running"] == 0 and info["num_waiting"] == 0
                and info["kv_used_tokens"] == 0 and info["num_pending_requests"] == 0):
            return info
        time.sleep(0.1)
    raise AssertionError(f"server not idle after {timeout} s: {info}")


class RouterProcess:
    """`radixflow router <flags>` on a free port, healthy when built; `stop()` returns its
    exit code."""

    def __init__(self, *flags: str, timeout: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixflow.runtime.cli", "router", "--port", str(self.port),
             "--log-level", "warning", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            if wait_healthy(self.proc, self.url, timeout):
                return
        except RuntimeError as exc:
            raise RuntimeError(f"router: {exc}: {self.proc.stdout.read()}") from None
        self.stop()
        raise RuntimeError("the router did not come up")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
