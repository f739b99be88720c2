"""stop_regex, logit_bias and stream_interval through the in-process Engine on a tiny model, and
the SGLang options it refuses rather than ignores; the KV invariant holds after each."""

from __future__ import annotations

import pytest
import regex
from helpers.engine_checks import settle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest

GREEDY = {"temperature": 0, "ignore_eos": True}
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=3000,
                max_running_requests=8, chunked_prefill_size=32) as eng:
        yield eng


@pytest.fixture(scope="module")
def free(engine):
    """The unconstrained greedy answer every test compares with."""
    return engine.generate(PROMPT, {"max_new_tokens": 24, **GREEDY})


def wildcard_pattern(text: str) -> str:
    """A three-character regex (middle character any) that first occurs mid-`text`."""
    for i in range(len(text) // 3, len(text) - 2):
        if "\ufffd" not in (text[i], text[i + 2]):
            return f"(?s){regex.escape(text[i])}.{regex.escape(text[i + 2])}"
    raise AssertionError(f"no pattern to pick in {text!r}")


def test_stop_regex_cuts_the_text_and_stops_the_request(engine, free):
    pattern = wildcard_pattern(free["text"])
    match = regex.search(pattern, free["text"])
    res = engine.generate(PROMPT, {"max_new_tokens": 24, "stop_regex": pattern, **GREEDY})
    assert res["text"] == free["text"][:match.start()]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    # generation ended with the token that completed the match, not at max_new_tokens
    n = res["meta_info"]["completion_tokens"]
    assert n < 24 and res["output_ids"] == free["output_ids"][:n]
    settle(engine)


def test_stop_regex_with_no_stop_trim_keeps_the_match(engine, free):
    pattern = wildcard_pattern(free["text"])
    match = regex.search(pattern, free["text"])
    res = engine.generate(PROMPT, {"max_new_tokens": 24, "stop_regex": [pattern],
                                   "no_stop_trim": True, **GREEDY})
    assert res["text"] == free["text"][:match.end()]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    settle(engine)


def test_streamed_stop_regex_never_shows_what_the_answer_cuts(engine, free):
    pattern = wildcard_pattern(free["text"])
    params = {"max_new_tokens": 24, "stop_regex": [pattern], **GREEDY}
    events = list(engine.generate(PROMPT, params, stream=True))
    final = engine.generate(PROMPT, params)
    assert events[-1]["text"] == final["text"]
    assert all(final["text"].startswith(e["text"]) for e in events)
    assert events[-1]["meta_info"]["finish_reason"] == final["meta_info"]["finish_reason"]
    settle(engine)


def test_stop_regex_and_stop_strings_together(engine, free):
    text = free["text"]
    pattern = wildcard_pattern(text)
    match = regex.search(pattern, text)
    early = text[2:4]  # a stop string well before the regex's match
    res = engine.generate(PROMPT, {"max_new_tokens": 24, "stop": [early],
                                   "stop_regex": [pattern], **GREEDY})
    cut = min(text.index(early), match.start())
    assert res["text"] == text[:cut]
    settle(engine)


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}x(", "x" * 2000])
def test_invalid_stop_regex_is_a_400(engine, pattern):
    with pytest.raises(InvalidRequest) as info:
        engine.generate(PROMPT, {"max_new_tokens": 4, "stop_regex": pattern})
    assert info.value.param == "stop_regex" and info.value.status_code == 400
    settle(engine)


def test_logit_bias_forces_a_token(engine, free):
    forced = next(t for t in range(100, 512) if t not in free["output_ids"])
    for params in ({"max_new_tokens": 10, **GREEDY},
                   {"max_new_tokens": 10, "temperature": 1.0, "top_p": 0.95, "seed": 3}):
        res = engine.generate(PROMPT, {**params, "logit_bias": {str(forced): 100}})
        assert res["output_ids"] == [forced] * 10
    settle(engine)


def test_logit_bias_bans_tokens_even_for_greedy(engine, free):
    banned = sorted(set(free["output_ids"]))
    assert len(banned) > 3  # the unbiased answer holds them
    res = engine.generate(PROMPT, {"max_new_tokens": 24, **GREEDY,
                                   "logit_bias": {str(t): -100 for t in banned}})
    assert len(res["output_ids"]) == 24 and not set(res["output_ids"]) & set(banned)
    sampled = engine.generate(PROMPT, {"max_new_tokens": 24, "temperature": 2.0, "seed": 5,
                                       "ignore_eos": True, "logit_bias": {t: -100 for t in banned}})
    assert not set(sampled["output_ids"]) & set(banned)
    settle(engine)


def test_logit_bias_is_per_request_in_a_batch(engine, free):
    first = free["output_ids"][0]
    outs = engine.generate([PROMPT, PROMPT], [
        {"max_new_tokens": 24, **GREEDY, "logit_bias": {first: -100}},
        {"max_new_tokens": 24, **GREEDY}])
    assert outs[0]["output_ids"][0] != first
    assert outs[1]["output_ids"] == free["output_ids"]
    settle(engine)


@pytest.mark.parametrize("bias", [{"512": 1}, {"100000": -100}, {"5": 150}, {"5": -100.5},
                                  {"five": 1}, {"-3": 1}])
def test_bad_logit_bias_is_a_400(engine, bias):
    with pytest.raises(InvalidRequest) as info:
        engine.generate(PROMPT, {"max_new_tokens": 4, "logit_bias": bias})
    assert info.value.param == "logit_bias" and info.value.status_code == 400
    key = next(iter(bias))
    if key.isdigit() and int(key) >= 512:
        assert key in info.value.message  # the id outside the vocabulary is named
    settle(engine)


def test_lora_path_and_custom_params_are_refused(engine):
    with pytest.raises(InvalidRequest, match="lora_path is not supported"):
        engine.generate(PROMPT, {"max_new_tokens": 4}, lora_path="my-adapter")
    for key in ("custom_params", "lora_path"):
        with pytest.raises(InvalidRequest, match=f"{key} is not supported") as info:
            engine.generate(PROMPT, {"max_new_tokens": 4, key: {"x": 1}})
        assert info.value.param == key
    with pytest.raises(InvalidRequest, match="custom_logit_processor is not supported"):
        engine.generate(PROMPT, {"max_new_tokens": 4}, custom_logit_processor="{}")
    settle(engine)


def test_stream_interval_streams_every_n_tokens(engine, free):
    params = {"max_new_tokens": 13, **GREEDY}
    events = list(engine.generate(PROMPT, {**params, "stream_interval": 4}, stream=True))
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts[-1] == 13 and events[-1]["text"] == engine.generate(PROMPT, params)["text"]
    assert all(b - a >= 4 for a, b in zip(counts, counts[1:-1]))  # the last one: at the end
    every = list(engine.generate(PROMPT, params, stream=True))
    assert len(events) < len(every)
    settle(engine)


def test_spaces_between_special_tokens_is_accepted_either_way(engine, free):
    for flag in (True, False):
        res = engine.generate(PROMPT, {"max_new_tokens": 24, **GREEDY,
                                       "spaces_between_special_tokens": flag})
        assert res["text"] == free["text"]  # a fast tokenizer has no such option (as SGLang)
    settle(engine)


def test_logit_bias_through_the_c_decode_step(tiny_model_factory, cpu_level):
    """The int4 model decodes through kernels/cpu's C step; its greedy rows still get the bias
    (the argmax is taken by the sampler, after the bias)."""
    folder = tiny_model_factory("qwen3")
    dtype = "bfloat16" if cpu_level == "avx512" else "float32"
    params = {"max_new_tokens": 12, **GREEDY}
    with Engine(str(folder), quantization="int4", max_total_tokens=512, cpu_isa=cpu_level,
                dtype=dtype) as eng:
        step = eng.scheduler.runner.cpu_decode
        assert step is not None
        free_ids = eng.generate(PROMPT, params)["output_ids"]
        calls = step.calls
        banned = eng.generate(PROMPT, {**params, "logit_bias": {t: -100 for t in free_ids}})
        forced = eng.generate(PROMPT, {**params, "logit_bias": {"7": 100}})
        assert step.calls > calls
        settle(eng)
    assert len(set(free_ids)) > 1
    assert not set(banned["output_ids"]) & set(free_ids)
    assert forced["output_ids"] == [7] * 12
