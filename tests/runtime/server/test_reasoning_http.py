"""Reasoning models over HTTP: `radixflow serve --reasoning-parser qwen3` on a tiny random model
with Qwen3's real tokenizer and template. Chat's reasoning_content (non-stream, and streamed as
delta.reasoning_content chunks that add up to it), a response_format that holds only the
answer, enable_thinking, /generate's separate_reasoning, and the 400s and start-up errors.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import openai
import pytest
import requests
from helpers.thinking_model import make_thinking_model

from radixflow.runtime.server.process import ServerProcess

SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}},
          "required": ["answer"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
START, END = 151667, 151668  # <think>, </think> in Qwen3's vocabulary


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    folder = make_thinking_model(tmp_path_factory.mktemp("thinking-server"))
    rt = ServerProcess(str(folder), reasoning_parser="qwen3", dtype="float32",
                       max_total_tokens=2048, served_model_name="tiny", log_level="warning",
                       start_timeout=300)
    yield rt
    rt.shutdown()


@pytest.fixture(scope="module")
def oai(thinking_server):
    return openai.OpenAI(base_url=thinking_server.url + "/v1", api_key="unused",
                         max_retries=0, timeout=120)


def chat(budget: int | None = 3, **more) -> dict:
    """A greedy chat that opens its thinking (the bias on <think>) and thinks <think>s."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Pick a number."}],
            "max_tokens": 40, "temperature": 0, "logit_bias": {str(START): 100}, **more}
    if budget is not None:
        body["thinking_budget"] = budget
    return body


def post(server, path: str, body: dict) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def test_chat_separates_the_reasoning_and_the_schema_holds_the_answer(thinking_server):
    res = post(thinking_server, "/v1/chat/completions",
               chat(response_format=JSON_FORMAT)).json()
    message = res["choices"][0]["message"]
    assert message["reasoning_content"] == "<think>" * 3  # unconstrained: not JSON
    jsonschema.validate(json.loads(message["content"]), SCHEMA)
    assert res["choices"][0]["finish_reason"] == "stop"
    # <think>, three thinking tokens, </think>
    assert res["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_streamed_reasoning_deltas_add_up_to_the_non_stream_message(thinking_server, oai,
                                                                    stream_reasoning):
    body = chat(budget=4, response_format=JSON_FORMAT)
    whole = post(thinking_server, "/v1/chat/completions", body).json()["choices"][0]["message"]
    extra = {k: body.pop(k) for k in ("thinking_budget", "logit_bias")}
    extra["stream_reasoning"] = stream_reasoning
    chunks = list(oai.chat.completions.create(stream=True, extra_body=extra, **body))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas]
    pieces = [r for r in reasoning if r]
    assert "".join(pieces) == whole["reasoning_content"] == "<think>" * 4
    # streamed: a piece a step, unless steps came faster than they were sent (then merged)
    assert 1 <= len(pieces) <= 4 if stream_reasoning else len(pieces) == 1
    assert "".join(d.content or "" for d in deltas) == whole["content"]
    first_content = next(i for i, d in enumerate(deltas) if d.content)
    assert all(not r for r in reasoning[first_content:])  # the thinking came first


def test_enable_thinking_false_makes_the_output_all_answer(thinking_server):
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    res = post(thinking_server, "/v1/chat/completions",
               chat(None, max_tokens=6, ignore_eos=True, **kwargs)).json()
    message = res["choices"][0]["message"]
    # the template closed the thinking in the prompt: a marker now is answer text
    assert message == {"role": "assistant", "content": "<think>" * 6, "reasoning_content": None}
    held = post(thinking_server, "/v1/chat/completions",
                chat(None, response_format=JSON_FORMAT, **kwargs)).json()
    message = held["choices"][0]["message"]
    assert message["reasoning_content"] is None
    jsonschema.validate(json.loads(message["content"]), SCHEMA)  # held from the first token


def test_separate_reasoning_false_keeps_the_text_whole(thinking_server):
    res = post(thinking_server, "/v1/chat/completions",
               chat(budget=2, max_tokens=5, ignore_eos=True, separate_reasoning=False)).json()
    message = res["choices"][0]["message"]
    assert message["content"] == "<think>" * 3 + "</think>" + "<think>"
    assert "reasoning_content" not in message


def test_generate_separate_reasoning_puts_it_in_meta_info(thinking_server):
    body = {"text": "Q: 1+1?<think>\n", "separate_reasoning": True,
            "sampling_params": {"max_new_tokens": 30, "temperature": 0, "thinking_budget": 2,
                                "regex": "[0-9]+", "logit_bias": {str(START): 100}}}
    res = post(thinking_server, "/generate", body).json()
    meta = res["meta_info"]
    # a first <think> repeats the prompt's opener (R1-0528 does): not thinking, not counted
    assert res["output_ids"][:4] == [START, START, START, END]
    assert meta["reasoning_text"] == "<think><think>"
    assert meta["reasoning_tokens"] == 4 and res["text"].isdigit()


@pytest.mark.parametrize("budget", [-1, 1 << 40, "64"])
def test_a_bad_thinking_budget_is_a_400(thinking_server, budget):
    res = post(thinking_server, "/v1/chat/completions", chat(budget))
    assert res.status_code == 400 and res.json()["error"]["param"] == "thinking_budget"
    res = post(thinking_server, "/generate",
               {"text": "Hi", "sampling_params": {"thinking_budget": budget}})
    assert res.status_code == 400 and "thinking_budget" in res.json()["error"]["message"]


def test_a_server_without_a_parser_refuses_reasoning_fields(server):
    res = post(server, "/v1/chat/completions",
               {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "thinking_budget": 8})
    assert res.status_code == 400
    assert "needs a server started with --reasoning-parser" in res.json()["error"]["message"]
    res = post(server, "/generate", {"text": "Hi", "separate_reasoning": True})
    assert res.status_code == 400 and res.json()["error"]["param"] == "separate_reasoning"
    # chat on a server without a parser: no reasoning_content at all
    res = post(server, "/v1/chat/completions",
               {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 2}).json()
    assert "reasoning_content" not in res["choices"][0]["message"]


def test_model_info_names_the_parser(thinking_server):
    info = requests.get(thinking_server.url + "/get_model_info", timeout=30).json()
    assert info["reasoning_parser"] == "qwen3"


def test_an_unknown_parser_is_a_start_up_error():
    proc = subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", "serve",
                           "--reasoning-parser", "deepseek-r2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "'deepseek-r2' is not a reasoning parser; the choices are deepseek-r1" in proc.stderr


def test_a_dsl_program_separates_reasoning_through_program(thinking_server):
    import regex

    import radixflow as rf

    @rf.function
    def pick(s):
        s += "Pick a number.<think>\n"  # the prompt opens the thinking, as R1's template does
        s += rf.gen("n", regex="[0-9]{3}", reasoning=True, thinking_budget=3, max_tokens=20,
                    temperature=0)

    s = pick.run(backend=rf.Endpoint(thinking_server.url))
    assert regex.fullmatch("[0-9]{3}", s["n"])
    assert s["n_reasoning_content"] == s.get_meta_info("n")["reasoning_text"]
    assert 1 <= s.get_meta_info("n")["reasoning_tokens"] <= 4
    assert s.text() == "Pick a number.<think>\n" + s["n"]
