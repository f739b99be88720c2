"""The model's sampling defaults on every HTTP route: the SamplingParams each route hands the
scheduler (an in-process app whose scheduler client captures them; no model, no processes)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.model_loader.generation_defaults import MODEL_INFO_KEY, constant_defaults
from radixflow.runtime.server.http_server import create_app
from radixflow.runtime.server.scheduler_client import SchedulerClient
from radixflow.runtime.server_args import ServerArgs

MODEL = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
         "repetition_penalty": 1.1}
MESSAGES = [{"role": "user", "content": "hi"}]
PROMPT = "The quick brown fox"


class Captured(Exception):
    pass


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def make_app(tokenizer, tmp_path, defaults):
    info = {"model_path": "/models/tiny", "context_length": 512, "max_total_tokens": 4096,
            "vocab_size": len(tokenizer), "eos_token_ids": [2], "reasoning_parser": None,
            "embedding": None, MODEL_INFO_KEY: defaults}
    client = SchedulerClient(tokenizer, info, scheduler_addr=f"ipc://{tmp_path}/sched",
                             recv_addr=f"ipc://{tmp_path}/recv")
    seen = []

    def submit(reqs):  # what the scheduler would receive
        seen.extend(req.sampling for req in reqs)
        raise InvalidRequest("captured")

    client.submit = submit
    app = create_app(ServerArgs(), client, served_model_name="tiny")
    return TestClient(app), seen, client


@pytest.fixture
def served(tokenizer, tmp_path):
    http, seen, client = make_app(tokenizer, tmp_path, {**constant_defaults(), **MODEL})
    yield http, seen
    http.close()
    client.send_ctx.destroy(linger=0)
    client.ctx.destroy(linger=0)


# Each route, with a body that sets no sampling option (or sets them to null).
ROUTES = {
    "/generate": {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}},
    "/generate (nulls)": {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 2, "temperature": None, "top_p": None, "top_k": None}},
    "/v1/completions": {"model": "tiny", "prompt": PROMPT, "max_tokens": 2},
    "/v1/chat/completions": {"model": "tiny", "messages": MESSAGES, "max_tokens": 2},
    "/v1/chat/completions (nulls)": {"model": "tiny", "messages": MESSAGES, "max_tokens": 2,
                                     "temperature": None, "top_p": None, "min_p": None},
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"model": "tiny", "messages": MESSAGES, "max_tokens": 2},
    "/program": {"text": PROMPT, "nodes": [
        {"type": "gen", "name": "a", "sampling_params": {"max_new_tokens": 2}}]},
}


def post(http, route: str, body: dict):
    return http.post(route.split(" ")[0], json=body)


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_route_takes_the_models_defaults(served, route):
    http, seen = served
    post(http, route, ROUTES[route])
    (sampling,) = seen
    assert {k: getattr(sampling, k) for k in MODEL} == MODEL, route
    assert sampling.max_new_tokens == 2


# The same routes, each setting every one of the five options itself.
OWN = {"temperature": 0.0, "top_p": 0.5, "top_k": 3, "min_p": 0.2, "repetition_penalty": 1.3}
OWN_BODIES = {
    "/generate": {"text": PROMPT, "sampling_params": {"max_new_tokens": 2, **OWN}},
    "/v1/completions": {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, **OWN},
    "/v1/chat/completions": {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **OWN},
    "/v1/responses": {"model": "tiny", "input": "hi", "max_output_tokens": 2, **OWN},
    "/program": {"text": PROMPT, "nodes": [
        {"type": "gen", "name": "a", "sampling_params": {"max_new_tokens": 2, **OWN}}]},
}


@pytest.mark.parametrize("route", list(OWN_BODIES))
def test_a_requests_own_values_win(served, route):
    http, seen = served
    post(http, route, OWN_BODIES[route])
    (sampling,) = seen
    assert {k: getattr(sampling, k) for k in OWN} == OWN, route


def test_messages_own_values_win(served):
    http, seen = served  # Anthropic's sampling fields: temperature, top_p, top_k
    own = {"temperature": 0.0, "top_p": 0.5, "top_k": 3}
    post(http, "/v1/messages", {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, **own})
    (sampling,) = seen
    assert {k: getattr(sampling, k) for k in own} == own
    assert sampling.min_p == MODEL["min_p"]  # what it cannot set stays the model's


def test_one_option_set_the_others_the_models(served):
    http, seen = served
    post(http, "/generate", {"text": PROMPT, "sampling_params": {"temperature": 0}})
    (sampling,) = seen
    assert sampling.temperature == 0 and sampling.is_greedy
    assert sampling.top_p == MODEL["top_p"] and sampling.top_k == MODEL["top_k"]


def test_openai_mode_keeps_the_constants(tokenizer, tmp_path):
    http, seen, client = make_app(tokenizer, tmp_path, constant_defaults())
    try:
        for route in ("/generate", "/v1/chat/completions", "/v1/completions"):
            post(http, route, ROUTES[route])
        assert len(seen) == 3
        for sampling in seen:
            assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p,
                    sampling.repetition_penalty) == (1.0, 1.0, -1, 0.0, 1.0)
        info = http.get("/get_model_info").json()
        assert info[MODEL_INFO_KEY] == constant_defaults()
    finally:
        http.close()
        client.send_ctx.destroy(linger=0)
        client.ctx.destroy(linger=0)


def test_get_model_info_shows_the_defaults_in_force(served):
    http, _ = served
    info = http.get("/get_model_info").json()
    assert info[MODEL_INFO_KEY] == {**constant_defaults(), **MODEL}
