"""Speculative decoding through the server: OpenAI's `prediction` with the openai client (its
usage says what the prediction saved), /generate's `speculative`, and the counters in /metrics."""

from __future__ import annotations

import time

import requests

from radixflow.runtime.scheduler.process import STATS_INTERVAL_S

HI = [{"role": "user", "content": "Say something about foxes."}]


def test_a_prediction_is_served_and_counted(client):
    plain = client.chat.completions.create(model="tiny", messages=HI, max_tokens=24,
                                           temperature=0)
    text = plain.choices[0].message.content
    predicted = client.chat.completions.create(
        model="tiny", messages=HI, max_tokens=24, temperature=0,
        prediction={"type": "content", "content": text})
    assert predicted.choices[0].message.content == text  # greedy: the same output
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.rejected_prediction_tokens >= 0
    assert plain.usage.completion_tokens_details is None  # no prediction: no counts


def test_generate_speculates_on_request_and_metrics_count_it(server):
    body = {"text": "a b c a b c a b c a b", "speculative": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    assert meta["spec_verify_ct"] >= 0 and meta["spec_accept_length"] >= 1.0
    bad = requests.post(server.url + "/generate", json={**body, "speculative": "on"},
                        timeout=60)
    assert bad.status_code == 400 and "speculative" in bad.text
    deadline = time.monotonic() + 10 * STATS_INTERVAL_S
    while time.monotonic() < deadline:
        text = requests.get(server.url + "/metrics", timeout=30).text
        if _value(text, "radixflow:spec_verify_passes_total") > 0:
            break
        time.sleep(STATS_INTERVAL_S / 5)
    for name in ("radixflow:spec_draft_tokens_total", "radixflow:spec_accepted_tokens_total",
                 "radixflow:spec_accept_rate", "radixflow:spec_accept_length"):
        assert name in text, name
    assert _value(text, "radixflow:spec_verify_passes_total") > 0


def _value(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
