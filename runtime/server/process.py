"""`ServerProcess`: `radixflow serve` as a subprocess of this program (rf.Runtime, tests, bench)."""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from ..errors import ServerUnavailable
from ..ipc import free_port  # noqa: F401 -- tests and bench import it from here
from ..server_args import ServerArgs, server_args_from
from .launch import PARENT_PID_ENV


def cli_flags(args: ServerArgs) -> list[str]:
    """The `radixflow serve` flags that reproduce `args` (fields left at default omitted)."""
    flags: list[str] = []
    for f in dataclasses.fields(ServerArgs):
        value = getattr(args, f.name)
        if value == f.default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag)  # only store_true flags exist, and True differs from default
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


class ServerProcess:
    """Start a radixflow server in a subprocess and wait until it is healthy.

    `ServerProcess(model_path=None, **server_args)`: ServerArgs fields as keywords (`model=` is
    the same as `model_path=`; None is the default SmolLM2-135M-Instruct); `port=None` picks a
    free port. The server stops with `shutdown()`, at the end of a `with` block, at interpreter
    exit, or when this process dies. Talk to it over HTTP at `url` (rf.Runtime does).

    Raises ValueError for invalid arguments and ServerUnavailable when the server does not
    come up (the message ends with its log).
    """

    def __init__(self, model_path: str | None = None, *, port: int | None = None,
                 start_timeout: float = 600.0, **kwargs: Any):
        host = kwargs.pop("host", "127.0.0.1")
        self.args = server_args_from(model_path, {**kwargs, "host": host,
                                                  "port": port or free_port(host)},
                                     who="Runtime")
        self.url = f"http://{self.args.host}:{self.args.port}"
        # Open for the server's whole life; closed in shutdown().
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="radixflow-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "radixflow.runtime.cli", "serve", *cli_flags(self.args)]
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid())}
        self.proc: subprocess.Popen | None = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        atexit.register(self.shutdown)
        try:
            self._wait_healthy(start_timeout)
        except BaseException:
            self.shutdown()
            raise

    @property
    def base_url(self) -> str:
        return self.url

    @property
    def log_path(self) -> str:
        return self._log.name

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.args.api_key}"} if self.args.api_key else {}

    def _wait_healthy(self, timeout: float) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise ServerUnavailable(
                    f"radixflow serve exited with code {code} during start-up:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise ServerUnavailable(f"radixflow serve was not healthy after {timeout:.0f} s:\n"
                                f"{self.log_tail()}")

    def log_tail(self, num_lines: int = 40) -> str:
        with open(self._log.name, errors="replace") as f:
            return "".join(f.readlines()[-num_lines:])

    def shutdown(self, timeout: float = 20.0) -> int | None:
        """Stop the server (SIGTERM, then SIGKILL after `timeout`); return its exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        atexit.unregister(self.shutdown)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()
        if proc.returncode == 0:
            os.unlink(self._log.name)
        return proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
