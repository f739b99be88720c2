"""SGLang's offline calls, on the in-process Engine and on Runtime (a live server): the same
calls, the same answers."""

from __future__ import annotations

import asyncio

import pytest

import radixflow as rf

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def test_one_prompt_a_batch_and_token_ids(backend):
    one = backend.generate("The capital of France is", {"max_new_tokens": 8})
    assert isinstance(one["text"], str) and one["meta_info"]["completion_tokens"] <= 8
    assert len(one["output_ids"]) == one["meta_info"]["completion_tokens"]

    batch = backend.generate(["a", "b"], GREEDY)
    assert [len(r["output_ids"]) for r in batch] == [6, 6]
    per_prompt = backend.generate(["a", "b"], [GREEDY, {**GREEDY, "max_new_tokens": 3}])
    assert [len(r["output_ids"]) for r in per_prompt] == [6, 3]

    ids = backend.generate(input_ids=[[5, 6, 7], [8, 9]], sampling_params=GREEDY)
    assert [r["meta_info"]["prompt_tokens"] for r in ids] == [3, 2]
    again = backend.generate(input_ids=[5, 6, 7], sampling_params=GREEDY)
    assert again["output_ids"] == ids[0]["output_ids"]


def test_logprobs_keywords(backend):
    out = backend.generate("Hello there", GREEDY, return_logprob=True, logprob_start_len=0,
                           top_logprobs_num=2)
    meta = out["meta_info"]
    assert len(meta["output_token_logprobs"]) == 6
    assert len(meta["output_top_logprobs"][0]) == 2
    assert meta["input_token_logprobs"][0][0] is None  # the first prompt token has no logprob


def test_stream_is_an_iterator_of_events(backend):
    events = list(backend.generate("Once upon a time", GREEDY, stream=True))
    assert events[-1]["text"] == backend.generate("Once upon a time", GREEDY)["text"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_async_generate(backend):
    async def main():
        one, two = await asyncio.gather(backend.async_generate("Once upon a time", GREEDY),
                                        backend.async_generate(["x", "y"], GREEDY))
        stream = await backend.async_generate("Once upon a time", GREEDY, stream=True)
        events = [event async for event in stream]
        return one, two, events

    one, two, events = asyncio.run(main())
    assert len(two) == 2 and events[-1]["text"] == one["text"]


def test_get_server_info(backend):
    info = backend.get_server_info()
    assert info["model_info"]["model_path"] and info["version"]
    assert info["num_running"] >= 0 and info["kv_total_tokens"] > 0  # (a shared server)
    assert "api_key" not in info and info["api_key_set"] is False
    assert info["max_running_requests"] > 0


def test_engine_and_runtime_agree(engine_backend, server_backend):
    prompts = ["The quick brown fox", "JSON {"]
    assert ([r["output_ids"] for r in engine_backend.generate(prompts, GREEDY)]
            == [r["output_ids"] for r in server_backend.generate(prompts, GREEDY)])


def test_a_body_is_not_a_prompt(backend):
    with pytest.raises(TypeError, match="generate_from_body"):
        backend.generate({"text": "hi", "sampling_params": GREEDY})
    with pytest.raises(TypeError, match="no_such_field"):
        backend.generate("hi", GREEDY, no_such_field=1)
    assert backend.generate_from_body({"text": "hi", "sampling_params": GREEDY})["text"]


def test_one_class_each():
    from radixflow.runtime.engine import Engine

    assert rf.Engine is Engine
    assert rf.Runtime.__module__ == "radixflow.backends.runtime"


def test_constructor_arguments(lang_tiny_model):
    with pytest.raises(ValueError, match="not both"):
        rf.Engine(str(lang_tiny_model), model=str(lang_tiny_model))
    with pytest.raises(ValueError, match="mem_fraction_statc"):
        rf.Engine(str(lang_tiny_model), mem_fraction_statc=0.5)
    with rf.Engine(model_path=str(lang_tiny_model), dtype="float32",
                   max_total_tokens=1024) as engine:
        assert engine.generate("hi", GREEDY)["meta_info"]["completion_tokens"] == 6
        assert engine.get_tokenizer() is engine.tokenizer
    with pytest.raises(rf.ServerUnavailable):
        engine.generate("hi", GREEDY)  # after shutdown: a clear error, not a hang
