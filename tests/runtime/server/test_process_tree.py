"""The whole process tree survives its parts: a killed detokenizer, a killed HTTP process (the
parent) or a killed scheduler replica under --dp-size 2 ends the requests in flight at once
(an error or a closed connection, never a hang), the server stops with a message naming the
dead process, and no child outlives it."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import requests
from helpers.live_server import LiveServer, is_alive, kill_all, wait_gone

STREAM = {"text": "Once", "stream": True,
          "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}


class Stream(threading.Thread):
    """A streamed /generate on its own thread: its events, or the error that ended it."""

    def __init__(self, url: str, body: dict = STREAM):
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.events: list[bytes] = []
        self.status: int | None = None
        self.error: Exception | None = None
        self.streaming = threading.Event()
        self.ended_at: float | None = None
        self.start()

    def run(self) -> None:
        try:
            with requests.post(self.url + "/generate", json=self.body, stream=True,
                               timeout=60) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith(b"data:"):
                        self.events.append(line)
                        self.streaming.set()
        except requests.RequestException as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.streaming.set()

    def assert_cut_short(self, since: float, within: float = 30.0) -> None:
        self.join(within)
        assert not self.is_alive(), "the stream hung after a process died"
        assert self.ended_at - since < within
        assert self.status in (None, 200)
        done = [e for e in self.events if b'"type": "length"' in e or b'"type":"length"' in e]
        assert not done, "it finished as if nothing had happened"


def server_info(srv: LiveServer) -> dict:
    return requests.get(srv.url + "/get_server_info", timeout=30).json()


@pytest.fixture
def live(tiny_model_dir, tmp_path):
    started: list[LiveServer] = []

    def start(*flags: str) -> LiveServer:
        srv = LiveServer("--model", str(tiny_model_dir), "--max-total-tokens", "2048", *flags,
                         log_path=tmp_path / f"serve-{len(started)}.log")
        started.append(srv)
        return srv

    yield start
    for srv in started:
        kill_all(srv.children())
        srv.stop(signal.SIGKILL)


def test_killed_detokenizer_ends_streams_and_stops_the_server(live):
    srv = live()
    info = server_info(srv)
    children = srv.children()
    stream = Stream(srv.url)
    assert stream.streaming.wait(60) and stream.events, "the request never started streaming"
    killed = time.monotonic()
    os.kill(info["processes"]["detokenizer"], signal.SIGKILL)
    stream.assert_cut_short(killed)
    assert srv.proc.wait(60) == 1
    assert "the detokenizer process died unexpectedly" in srv.log()
    assert not wait_gone(children), "child processes outlived the server"


def test_killed_http_process_takes_its_children_and_connections(live):
    srv = live()
    info = server_info(srv)
    children = srv.children()
    assert {info["processes"]["scheduler"], info["processes"]["detokenizer"]} <= children
    stream = Stream(srv.url)
    assert stream.streaming.wait(60) and stream.events, "the request never started streaming"
    killed = time.monotonic()
    srv.proc.kill()
    srv.proc.wait(30)
    stream.assert_cut_short(killed)
    assert stream.error is not None or stream.events, stream.__dict__
    assert not wait_gone(children, timeout=30), "children outlived the killed HTTP process"


def test_killed_replica_ends_streams_and_stops_the_server(live):
    srv = live("--dp-size", "2")
    info = server_info(srv)
    assert {"scheduler-0", "scheduler-1"} <= set(info["processes"])
    children = srv.children()
    streams = [Stream(srv.url) for _ in range(2)]  # round robin: one on each replica
    for s in streams:
        assert s.streaming.wait(120) and s.events, "a request never started streaming"
    victim = info["processes"]["scheduler-1"]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    for s in streams:
        s.assert_cut_short(killed)
    assert srv.proc.wait(60) == 1
    assert "the scheduler-1 process died unexpectedly" in srv.log()
    assert not is_alive(victim)
    assert not wait_gone(children), "child processes outlived the server"
