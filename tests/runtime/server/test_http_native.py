"""The SGLang-compatible native API of a live server, checked the way SGLang's frontend reads it."""

from __future__ import annotations

import json
import time

import requests
from helpers.live_server import server_info

from radixflow.runtime.scheduler.process import STATS_INTERVAL_S

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}


def post(server, path, body, **kw):
    return requests.post(server.url + path, data=json.dumps(body), headers=JSON_HEADERS,
                         timeout=120, **kw)


def test_model_and_server_info(server, tiny_model_dir):
    for path in ("/get_model_info", "/model_info"):
        info = requests.get(server.url + path, timeout=30).json()
        assert info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
    for path in ("/get_server_info", "/server_info"):
        info = requests.get(server.url + path, timeout=30).json()
        assert info["max_total_tokens"] == 4096 and info["model_info"]["vocab_size"] == 512
        assert "api_key" not in info
        assert info["served_model_name"] == "tiny" and info["served_model_names"] == ["tiny"]
        # the CPU's level and the kernels chosen for it (kernels/cpu/features.py)
        cpu = info["model_info"]["cpu"]
        assert cpu["level"] in ("avx512", "avx2", "generic") and info["cpu_isa"] == "auto"
        assert cpu["kernels"] in ("avx512", "avx2", "torch") and "decode_step" in cpu
        assert cpu["dense_weights"]["mode"] in ("on", "off", "none")  # --cpu-dense-weights
    assert requests.get(server.url + "/health_generate", timeout=60).status_code == 200


def test_generate_single(server, tokenizer):
    r = post(server, "/generate", {"text": "Hello there", "sampling_params": GREEDY})
    assert r.status_code == 200
    out = r.json()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode("Hello there"))
    assert meta["completion_tokens"] == 6 and len(out["output_ids"]) == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True)
    assert "output_token_logprobs" not in meta


def test_prefill_only_and_special_tokens(server):
    out = post(server, "/generate", {"text": "<|im_start|>user\nHi<|im_end|>",
                                     "sampling_params": {"max_new_tokens": 0}}).json()
    assert out["text"] == "" and out["meta_info"]["completion_tokens"] == 0
    # <|im_start|>, user, \n, H, i, <|im_end|>: special-token strings become single ids.
    assert out["meta_info"]["prompt_tokens"] == 6


def test_batch_is_in_order_and_matches_singles(server):
    texts = ["Once upon a time", "The capital of", "def add(a, b):"]
    batch = post(server, "/generate", {"text": texts, "sampling_params": GREEDY}).json()
    assert isinstance(batch, list) and len(batch) == 3
    for text, got in zip(texts, batch):
        single = post(server, "/generate", {"text": text, "sampling_params": GREEDY}).json()
        assert got["output_ids"] == single["output_ids"]


def test_select_style_logprobs(server, tokenizer):
    prompt = "Is water wet? Answer:"
    first = post(server, "/generate", {"text": prompt,
                                       "sampling_params": {"max_new_tokens": 0}}).json()
    start = max(first["meta_info"]["prompt_tokens"] - 2, 0)
    choices = [" Yes", " No"]
    outs = post(server, "/generate", {
        "text": [prompt + c for c in choices], "return_logprob": True,
        "return_text_in_logprobs": True, "logprob_start_len": start,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0}}).json()
    for choice, out in zip(choices, outs):
        entries = out["meta_info"]["input_token_logprobs"]
        ids = tokenizer.encode(prompt + choice)
        assert [e[1] for e in entries] == ids[start:]
        assert entries[0][0] is None and all(isinstance(e[0], float) for e in entries[1:])
        assert [e[2] for e in entries] == [tokenizer.decode([i]) for i in ids[start:]]
        assert out["meta_info"]["output_token_logprobs"] == []


def test_input_ids_logprobs_default_to_whole_prompt(server):
    ids = [[60, 61, 62, 63], [70, 71]]
    outs = post(server, "/generate", {"input_ids": ids, "return_logprob": True,
                                      "sampling_params": {"max_new_tokens": 0}}).json()
    for prompt, out in zip(ids, outs):
        entries = out["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in entries] == prompt and entries[0][0] is None


def test_stream_logprob_accounting(server):
    """The checks of SGLang's test_stream_logprobs, plus cumulative text."""
    body = {"text": "Once upon a time", "stream": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}}
    with post(server, "/generate", body, stream=True) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == b"data: [DONE]"
    events = [json.loads(ln[5:]) for ln in lines[:-1]]
    prev_tokens, prev_text = 0, ""
    for e in events:
        meta = e["meta_info"]
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] - prev_tokens
        assert meta["completion_tokens"] == meta["output_token_logprobs_length"]
        assert e["text"].startswith(prev_text)
        prev_tokens, prev_text = meta["completion_tokens"], e["text"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    full = post(server, "/generate", {**body, "stream": False}).json()
    assert events[-1]["text"] == full["text"]


def test_regex_constraint(server):
    out = post(server, "/generate", {"text": "Answer yes or no:", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "regex": "(yes|no)"}}).json()
    assert out["text"] in {"yes", "no"}
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


def test_bad_regex_is_400_even_when_streaming(server):
    for stream in (False, True):
        r = post(server, "/generate", {"text": "x", "stream": stream,
                                       "sampling_params": {"regex": "(unclosed"}})
        assert r.status_code == 400 and r.json()["error"]["message"]


def test_flush_routes(server):
    r = requests.post(server.url + "/flush_cache", timeout=30)  # no body, as the frontend sends
    assert r.status_code == 200
    assert requests.get(server.url + "/flush_cache", timeout=30).status_code == 200
    # /concate_and_append_request is refused: tests/runtime/server/test_sessions_http.py


def test_errors_name_the_field(server):
    r = post(server, "/generate", {"text": "x", "sampling_params": {"temperature": "hot"}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "temperature" and "temperature" in err["message"]
    r = requests.post(server.url + "/generate", data=b"\xff\xfe", timeout=30,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert requests.get(server.url + "/no_such_route", timeout=30).status_code == 404


def test_metrics(server):
    post(server, "/generate", {"text": "metrics", "sampling_params": GREEDY})
    text = requests.get(server.url + "/metrics", timeout=30).text
    for name in ("radixflow:num_requests_running", "radixflow:num_requests_waiting",
                 "radixflow:prompt_tokens_total", "radixflow:generation_tokens_total",
                 "radixflow:cache_hit_rate", "radixflow:kv_cache_usage",
                 "radixflow:time_to_first_token_seconds_bucket",
                 "radixflow:time_per_output_token_seconds_bucket",
                 "radixflow:e2e_request_latency_seconds_bucket"):
        assert name in text, name
    # The scheduler reports its counters every STATS_INTERVAL_S: wait for a report after ours.
    deadline = time.monotonic() + 10 * STATS_INTERVAL_S
    while server_info(server)["generation_tokens"] == 0 and time.monotonic() < deadline:
        time.sleep(STATS_INTERVAL_S / 5)
    assert server_info(server)["generation_tokens"] > 0


def test_program_runs_gens_through_the_server(server):
    prompt = "Q: What is 2+2?\nA:"
    sampling = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    program = {"text": "", "nodes": [
        {"type": "text", "text": prompt},
        {"type": "gen", "name": "answer", "sampling_params": sampling},
        {"type": "select", "name": "pick", "choices": [" yes", " no"]},
    ]}
    r = post(server, "/program", program)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["error"] is None
    direct = post(server, "/generate", {"text": prompt, "sampling_params": sampling}).json()
    assert out["variables"]["answer"] == direct["text"]
    assert out["variables"]["pick"] in {" yes", " no"}
    assert out["text"].startswith(prompt + direct["text"])
    bad = post(server, "/program", {"nodes": [{"type": "teleport"}]})
    assert bad.status_code == 400 and "nodes[0]" in bad.json()["error"]["message"]
