"""`radixflow serve --enable-priority-scheduling` end to end: with one running place, a
request of a lower priority value arriving later retracts the running one, finishes first, and
the retracted request resumes and completes with all its tokens."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from radixflow.runtime.server.process import ServerProcess


@pytest.fixture(scope="module")
def priority_server(tiny_model_dir):
    rt = ServerProcess(str(tiny_model_dir), enable_priority_scheduling=True,
                       max_running_requests=1, max_total_tokens=4096, log_level="warning",
                       start_timeout=300)
    yield rt
    assert rt.shutdown() == 0


def test_a_lower_value_preempts_and_both_complete(priority_server):
    url = priority_server.url + "/generate"
    long_params = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}
    finished: dict[str, float] = {}
    tokens: dict[str, int] = {}
    started = threading.Event()

    def background():
        with requests.post(url, json={"text": "Once upon a time", "sampling_params": long_params,
                                      "priority": 5, "stream": True},
                           stream=True, timeout=300) as r:
            assert r.status_code == 200, r.text
            last = None
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    started.set()
                    last = json.loads(line[6:])
            tokens["low"] = last["meta_info"]["completion_tokens"]
        finished["low"] = time.monotonic()

    thread = threading.Thread(target=background)
    thread.start()
    assert started.wait(120), "the first request never streamed"
    r = requests.post(url, json={"text": "The capital of France is", "priority": 0,
                                 "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                     "ignore_eos": True}}, timeout=300)
    finished["high"] = time.monotonic()
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 4
    thread.join(300)
    assert finished["high"] < finished["low"], finished  # it did not wait for 400 tokens
    assert tokens["low"] == 400  # retracted, resumed, nothing lost
    health = requests.get(priority_server.url + "/get_server_info", timeout=30)
    assert health.status_code == 200
