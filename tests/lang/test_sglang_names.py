"""A program written for `import sglang as sgl` runs as `import radixflow as sgl`: SGLang's
frontend names (lang/sglang_names.py) on the Engine and on a live server."""

from __future__ import annotations

import json
import re

import pytest

import radixflow as sgl
from radixflow.runtime.program.select import greedy_pick

CHOICES = ["yes", "no", "maybe so"]


@sgl.function
def sglang_style(s):
    s += "Answer: " + sgl.select("pick", CHOICES, 0.0, sgl.greedy_token_selection)
    s += "\nCount: " + sgl.gen_int("count", max_tokens=6)
    s += "\nName: " + sgl.gen_string("name", max_tokens=12)


def test_an_sglang_program_runs(backend):
    state = sglang_style.run(backend=backend, temperature=0)
    meta = state.get_meta_info("pick")
    assert meta["method"] == "greedy_token_selection"
    cond = [[e[0] for e in entries] for entries in meta["input_token_logprobs"]]
    assert state["pick"] == CHOICES[greedy_pick(cond)]
    assert re.fullmatch(r"[-+]?[0-9]+", state["count"].strip()), state["count"]
    assert isinstance(json.loads(state["name"]), str), state["name"]


def test_run_wide_logprobs(backend):
    state = sglang_style.run(backend=backend, temperature=0, return_logprob=True,
                             top_logprobs_num=2, return_text_in_logprobs=True)
    meta = state.get_meta_info("count")
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] > 0
    # (a token the grammar's budget-safe closing appended unsampled has no top list)
    sampled = [top for (lp, _, _), top in zip(meta["output_token_logprobs"],
                                              meta["output_top_logprobs"], strict=True)
               if lp > -9999.0]
    assert sampled and all(len(top) == 2 for top in sampled)


def test_runtime_endpoint_and_the_default_backends_cache(server_backend):
    endpoint = sgl.RuntimeEndpoint(server_backend.url)
    assert endpoint.model_info == server_backend.model_info
    prompt, params = "A prompt the cache keeps " * 8, {"max_new_tokens": 1}
    sgl.set_default_backend(endpoint)
    try:
        sglang_style.run(temperature=0)
        assert sgl.get_server_info()["tp_size"] == 1
        endpoint.generate(prompt, params)
        assert endpoint.generate(prompt, params)["meta_info"]["cached_tokens"] > 0
        sgl.flush_cache()
        assert endpoint.generate(prompt, params)["meta_info"]["cached_tokens"] == 0
    finally:
        sgl.set_default_backend(None)


def test_what_radixflow_refuses_it_says(server_backend):
    with pytest.raises(sgl.UnsupportedFeature, match="the model's own chat template"):
        sgl.RuntimeEndpoint(server_backend.url, chat_template_name="chatml")
    with pytest.raises(sgl.UnsupportedFeature, match="text models only"):
        sgl.image("cat.png")
    with pytest.raises(sgl.UnsupportedFeature, match="text models only"):
        sgl.video("cat.mp4", 4)
    with pytest.raises(sgl.InvalidRequest, match="temperature must be 0"):
        sgl.select("x", ["a", "b"], 0.7)


@pytest.mark.parametrize("cond, best", [
    ([[-1.0, -5.0], [-1.0, -2.0], [-3.0]], 1),  # tie on the first token, the second decides
    ([[-0.5], [-1.0, -0.1]], 0),
    ([[-1.0], [-1.0, -0.5]], 1),  # the shorter goes on with its mean (-1.0)
    ([[], [-9.0]], 1),  # a choice with no scored token never wins
])
def test_greedy_pick(cond, best):
    assert greedy_pick(cond) == best
