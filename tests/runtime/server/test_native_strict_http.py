"""A strict /generate on a live server: unknown and refused fields are 400s naming them,
priority needs its flag, cache_salt and routed_dp_rank are served."""

from __future__ import annotations

import json
import time

import pytest
import requests

GREEDY = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}


def post(server, body):
    return requests.post(server.url + "/generate", data=json.dumps(body), timeout=120,
                         headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("body, param, says", [
    ({"max_tokens": 2}, "max_tokens", "unknown field"),
    ({"return_entropy": True}, "return_entropy", "not supported"),
    ({"lora_path": "adapter"}, "lora_path", "LoRA"),
    ({"bootstrap_host": "10.0.0.1"}, "bootstrap_host", "disaggregation"),
    ({"priority": 1}, "priority", "--enable-priority-scheduling"),
    ({"routed_dp_rank": 1}, "routed_dp_rank", "not a replica"),
])
def test_bad_fields_are_400s_naming_them(server, body, param, says):
    r = post(server, {"text": "Hi", "sampling_params": GREEDY, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_served_extras_generate(server):
    body = {"text": "Hi", "sampling_params": GREEDY, "cache_salt": "tenant-a",
            "routed_dp_rank": 0, "log_metrics": False, "no_logs": True}
    r = post(server, body)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 2


def test_cache_salt_keeps_tenants_prefixes_apart(server):
    """The same prompt under another salt (or none) matches nothing; under its own salt it
    matches what that tenant computed."""
    prompt = "A tenant's private system prompt, which no other tenant may match. " * 4
    # the worker's shared server: an earlier test's unsalted prompt may share a first token
    for _ in range(60):
        if requests.post(server.url + "/flush_cache", timeout=60).status_code == 200:
            break
        time.sleep(0.5)  # (a request of an earlier test still finishing)
    else:
        pytest.fail("the server never became idle enough to flush its cache")

    def cached(**salt) -> int:
        r = post(server, {"text": prompt, "sampling_params": GREEDY, **salt})
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-b") == 0
    assert cached() == 0
    assert cached(cache_salt="tenant-a") >= 40
    assert cached() >= 40
