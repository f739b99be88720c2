"""Endpoint over HTTP against a small stand-in server (the scripted model behind FastAPI)."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from helpers.fake_backend import CHATML, FakeBackend
from helpers.http_stub import ServedApp, free_port

import radixflow as rf
from radixflow.chat_template import chat_template_of
from radixflow.runtime.program import execute_program


class StubServer:
    def __init__(self, *, program_route: bool = True, info: dict | None = None):
        self.fake = FakeBackend(
            respond=lambda p, sp: "Paris<|im_end|>" if "capital" in p else " hi")
        self.paths: list[str] = []
        self.headers: list[dict] = []
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):
            self.paths.append(request.url.path)
            self.headers.append(dict(request.headers))
            return await call_next(request)

        @app.get("/get_model_info")
        async def model_info():
            return info or {"model_path": "stub", "chat_template": CHATML}

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            if "forbidden" in json.dumps(body):
                return JSONResponse({"error": {"message": "forbidden word", "type": "x"}}, 400)
            out = self.fake.generate_from_body(body)
            if body.get("stream"):
                def events():
                    for event in out:
                        yield f"data: {json.dumps(event)}\n\n"
                    yield "data: [DONE]\n\n"
                return StreamingResponse(events(), media_type="text/event-stream")
            return out

        if program_route:
            @app.post("/program")
            async def program(request: Request):
                return execute_program(await request.json(), self.fake.generate_from_body)

        self.served = ServedApp(app)
        self.url = self.served.url

    def stop(self) -> None:
        self.served.stop()


@pytest.fixture(scope="module")
def stub():
    server = StubServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stub_without_program():
    server = StubServer(program_route=False, info={"model_path": "org/SmolLM2-135M-Instruct"})
    yield server
    server.stop()


@rf.function
def chat(s, question):
    s += rf.user(question)
    s += rf.assistant(rf.gen("answer", max_tokens=30))
    s += "Sure? " + rf.select("sure", choices=["yes", "no"])


def test_a_program_stretch_is_one_http_request(stub):
    backend = rf.Endpoint(stub.url + "/", api_key="k")
    stub.paths.clear()
    state = chat.run(question="The capital of France?", backend=backend)
    assert state["answer"] == "Paris" and state["sure"] in ("yes", "no")
    assert stub.paths == ["/program"]
    assert stub.headers[-1]["authorization"] == "Bearer k"
    assert state.messages()[-1] == {"role": "assistant", "content": "Paris"}


def test_without_program_route_the_client_runs_the_stretch(stub_without_program):
    backend = rf.Endpoint(stub_without_program.url)
    # the template comes from the model path when the server does not send one
    assert chat_template_of(backend).end_of_turn() == "<|im_end|>"
    stub_without_program.paths.clear()
    state = chat.run(question="The capital of France?", backend=backend)
    assert state["answer"] == "Paris"
    assert stub_without_program.paths == ["/program", "/generate", "/generate", "/generate"]
    stub_without_program.paths.clear()
    chat.run(question="again", backend=backend)
    assert "/program" not in stub_without_program.paths  # remembered


def test_streaming_over_sse(stub):
    backend = rf.Endpoint(stub.url)
    state = chat.run(question="The capital of France?", backend=backend, stream=True)
    assert "".join(state.text_iter("answer")) == "Paris"
    state.sync()
    assert state["sure"] in ("yes", "no")


def test_server_errors_are_typed_and_carry_the_message(stub):
    backend = rf.Endpoint(stub.url, use_program=False)

    @rf.function
    def bad(s):
        s += "forbidden" + rf.gen("x", max_tokens=2)

    with pytest.raises(rf.InvalidRequest, match="forbidden word"):
        bad.run(backend=backend)


def test_an_unreachable_server_names_its_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(rf.ServerUnavailable, match=f"cannot reach the radixflow server at {url}"):
        rf.Endpoint(url)


def test_default_backend_accepts_a_url(stub):
    rf.set_default_backend(stub.url)
    try:
        assert chat.run(question="hello")["answer"] == " hi"
    finally:
        rf.set_default_backend(None)
