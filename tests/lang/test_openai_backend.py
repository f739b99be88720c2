"""The OpenAI-compatible backend's translation, against a stand-in /v1 server."""

from __future__ import annotations

import json
import re

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from helpers.http_stub import ServedApp

import radixflow as rf


class OpenAIStub:
    """Answers /v1/completions and /v1/chat/completions with scripted text; records bodies."""

    def __init__(self):
        self.bodies: list[dict] = []
        app = FastAPI()

        def answer(body: dict) -> str:
            if body.get("regex"):
                return re.sub(r"[()\\]", "", body["regex"]).split("|")[-1]  # the last choice
            if body.get("response_format"):
                return '{"name": "Ada"}'
            text = " Paris. More"
            for stop in body.get("stop") or []:
                text = text.split(stop)[0]
            return text

        @app.post("/v1/completions")
        async def completions(request: Request):
            body = await request.json()
            self.bodies.append({"path": "completions", **body})
            text = answer(body)
            if body.get("stream"):
                def events():
                    for ch in text:
                        chunk = {"choices": [{"text": ch, "finish_reason": None}]}
                        yield f"data: {json.dumps(chunk)}\n\n"
                    yield "data: [DONE]\n\n"
                return StreamingResponse(events(), media_type="text/event-stream")
            choices = [{"index": i, "text": f"{text}{i or ''}", "finish_reason": "stop"}
                       for i in range(body.get("n", 1))]
            return {"id": "c1", "choices": choices,
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2}}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.bodies.append({"path": "chat", **body})
            message = {"role": "assistant", "content": answer(body)}
            return {"id": "c2", "choices": [{"message": message, "finish_reason": "stop"}],
                    "usage": {}}

        self.served = ServedApp(app)
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture(scope="module")
def stub():
    server = OpenAIStub()
    yield server
    server.stop()


def test_plain_programs_use_completions_with_the_text(stub):
    backend = rf.OpenAI("m", base_url=stub.url + "/v1", api_key="k")

    @rf.function
    def prog(s):
        s += "Capital of France:" + rf.gen("a", max_tokens=5, stop=".", temperature=0)
        s += " Pick: " + rf.select("c", choices=["Rome", "Oslo"])

    stub.bodies.clear()
    state = prog.run(backend=backend)
    assert state["a"] == " Paris" and state["c"] == "Oslo"
    first, second = stub.bodies
    assert first["path"] == "completions" and first["prompt"] == "Capital of France:"
    assert first["stop"] == ["."] and first["max_tokens"] == 5 and first["temperature"] == 0
    assert second["regex"] == "(Rome|Oslo)"
    assert state.get_meta_info("c")["method"] == "constrained_generation"


def test_role_programs_use_chat_messages_and_response_format(stub):
    backend = rf.OpenAI("m", base_url=stub.url + "/v1")

    @rf.function
    def prog(s):
        s += rf.system("Extract.")
        s += rf.user("Ada is 36.")
        s += rf.assistant(rf.gen("json", max_tokens=20, json_schema={"type": "object"}))

    stub.bodies.clear()
    state = prog.run(backend=backend)
    assert state["json"] == '{"name": "Ada"}'
    body = stub.bodies[0]
    assert body["path"] == "chat"
    assert body["messages"] == [{"role": "system", "content": "Extract."},
                                {"role": "user", "content": "Ada is 36."}]
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert state.messages()[-1] == {"role": "assistant", "content": '{"name": "Ada"}'}


def test_gen_outside_an_assistant_turn_of_a_chat_program_is_unsupported(stub):
    backend = rf.OpenAI("m", base_url=stub.url + "/v1")

    @rf.function
    def prog(s):
        s += rf.user("hi") + rf.gen("x")

    with pytest.raises(rf.UnsupportedFeature, match="inside an assistant turn"):
        prog.run(backend=backend)


def test_streaming_completions(stub):
    backend = rf.OpenAI("m", base_url=stub.url + "/v1")

    @rf.function
    def prog(s):
        s += "Q:" + rf.gen("a", max_tokens=9)

    state = prog.run(backend=backend, stream=True)
    assert list(state.text_iter("a")) == list(" Paris. More")


def test_n_samples_and_stop_regex(stub):
    backend = rf.OpenAI("m", base_url=stub.url + "/v1")

    @rf.function
    def many(s):
        s += "Say:" + rf.gen("a", max_tokens=5, n=3)

    stub.bodies.clear()
    state = many.run(backend=backend)
    assert state["a"] == [" Paris. More", " Paris. More1", " Paris. More2"]
    assert stub.bodies[0]["n"] == 3 and state.text() == "Say:"

    @rf.function
    def cut(s):
        s += "Say:" + rf.gen("a", max_tokens=5, stop_regex="[.]")

    with pytest.raises(rf.UnsupportedFeature, match="stop_regex"):
        cut.run(backend=backend)["a"]
