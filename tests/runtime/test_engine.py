"""Engine behaviour on a tiny model: sampling options, stops, aborts, retraction, errors,
and the slot-conservation invariant after every workload."""

from __future__ import annotations

import threading

import pytest
from helpers.engine_checks import settle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import ContextTooLong, InvalidRequest

GREEDY = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module", params=["overlap", "step by step"])
def engine(tiny_llama, request):
    """Every test twice: with the overlap scheduler (runtime/scheduler/decode.py) and
    without."""
    overlap = request.param == "overlap"
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=3000,
                max_running_requests=8, chunked_prefill_size=32,
                enable_overlap_schedule=overlap, disable_overlap_schedule=not overlap) as eng:
        yield eng


def test_greedy_is_deterministic_and_batch_independent(engine):
    single = engine.generate("The quick brown fox", {"max_new_tokens": 20, **GREEDY})
    batch = engine.generate(["A small model", "The quick brown fox", "JSON {"],
                            {"max_new_tokens": 20, **GREEDY})
    assert batch[1]["output_ids"] == single["output_ids"]
    assert single["meta_info"]["completion_tokens"] == 20
    assert single["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
    settle(engine)


def test_prefix_is_computed_once(engine):
    system = "The cache keeps every prefix that two requests share, so the " * 4
    engine.generate(system + "first", {"max_new_tokens": 1, **GREEDY})
    res = engine.generate(system + "second question", {"max_new_tokens": 1, **GREEDY})
    prompt_len = len(engine.tokenizer(system).input_ids)
    assert res["meta_info"]["cached_tokens"] >= prompt_len - 2
    settle(engine)


def test_seeded_sampling_repeats(engine):
    params = {"max_new_tokens": 16, "temperature": 1.0, "seed": 1234}
    a = engine.generate("Once upon a time", params)
    b = engine.generate(["noise", "Once upon a time", "more noise"], params)[1]
    assert a["output_ids"] == b["output_ids"]
    c = engine.generate("Once upon a time", {**params, "seed": 99})
    assert c["output_ids"] != a["output_ids"]
    settle(engine)


def test_n_samples(engine):
    res = engine.generate("Once upon a time", {"max_new_tokens": 8, "temperature": 1.0, "n": 3})
    assert isinstance(res, list) and len(res) == 3
    assert all(r["meta_info"]["completion_tokens"] == 8 for r in res)
    settle(engine)


def test_stop_string_is_cut_exactly(engine):
    free = engine.generate("The quick brown fox", {"max_new_tokens": 24, **GREEDY})
    text = free["text"]
    stop = text[5:8]
    assert stop and stop in text
    res = engine.generate("The quick brown fox", {"max_new_tokens": 24, "stop": [stop], **GREEDY})
    assert res["text"] == text[:text.index(stop)]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    settle(engine)


def test_stop_token_ids_and_min_new_tokens(engine):
    free = engine.generate("The quick brown fox", {"max_new_tokens": 16, **GREEDY})
    stop_id = free["output_ids"][3]
    first = free["output_ids"].index(stop_id)
    res = engine.generate("The quick brown fox",
                          {"max_new_tokens": 16, "stop_token_ids": [stop_id], **GREEDY})
    assert res["output_ids"] == free["output_ids"][:first + 1]
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    held = engine.generate("The quick brown fox", {
        "max_new_tokens": 16, "stop_token_ids": [stop_id], "min_new_tokens": 10, **GREEDY})
    assert stop_id not in held["output_ids"][:10]
    settle(engine)


def test_prefill_only_and_prompt_logprobs(engine):
    res = engine.generate("The quick brown fox jumps", {"max_new_tokens": 0},
                          return_logprob=True, logprob_start_len=2, return_text_in_logprobs=True)
    assert res["text"] == "" and res["output_ids"] == []
    entries = res["meta_info"]["input_token_logprobs"]
    assert len(entries) == res["meta_info"]["prompt_tokens"] - 2
    assert entries[0][0] is None and all(e[0] < 0 for e in entries[1:])
    assert "".join(e[2] for e in entries).strip() in "The quick brown fox jumps"
    settle(engine)


def test_output_logprobs_and_top(engine):
    res = engine.generate("The quick", {"max_new_tokens": 5, **GREEDY}, return_logprob=True,
                          top_logprobs_num=3)
    out = res["meta_info"]["output_token_logprobs"]
    tops = res["meta_info"]["output_top_logprobs"]
    assert [e[1] for e in out] == res["output_ids"]
    for entry, top in zip(out, tops):
        assert len(top) == 3 and top[0][1] == entry[1]  # greedy: the chosen token is the top one
        assert abs(top[0][0] - entry[0]) < 1e-5
    settle(engine)


def test_stream_grows_by_appending(engine):
    events = list(engine.generate("The quick brown fox", {"max_new_tokens": 12, **GREEDY},
                                  stream=True))
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert events[-1]["meta_info"]["finish_reason"] is not None
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    full = engine.generate("The quick brown fox", {"max_new_tokens": 12, **GREEDY})
    assert texts[-1] == full["text"]
    settle(engine)


def test_abandoned_stream_is_aborted(engine):
    stream = engine.generate("The quick brown fox", {"max_new_tokens": 2000, **GREEDY}, stream=True)
    next(stream)
    stream.close()  # the caller walks away: the request must be aborted, its slots freed
    settle(engine)
    assert engine.stats()["num_running"] == 0


def test_abort_by_rid(engine):
    result = {}
    streaming = threading.Event()

    def run():
        # streamed, so the abort lands once generation is under way (a request of this tiny
        # model can reach its context limit before a fixed sleep ends)
        for event in engine.generate("The quick", {"max_new_tokens": 2000, **GREEDY},
                                     rid="job-1", stream=True):
            result["last"] = event
            streaming.set()
        streaming.set()

    t = threading.Thread(target=run)
    t.start()
    assert streaming.wait(30)
    engine.abort("job-1")
    t.join(timeout=30)
    assert result["last"]["meta_info"]["finish_reason"]["type"] == "abort"
    settle(engine)


@pytest.mark.parametrize("params, match", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"bogus": 1}, "bogus"),
    ({"stop": 3}, "stop"),
    ({"n": 0}, "n"),
])
def test_bad_sampling_params(engine, params, match):
    with pytest.raises(InvalidRequest, match=match):
        engine.generate("hello", params)


def test_bad_prompts(engine):
    with pytest.raises(InvalidRequest):
        engine.generate("", {"max_new_tokens": 4})
    with pytest.raises(ContextTooLong):
        engine.generate(input_ids=[5] * 600, sampling_params={"max_new_tokens": 4})
    with pytest.raises(InvalidRequest):
        engine.generate(input_ids=[10**9], sampling_params={"max_new_tokens": 4})
    # the engine keeps serving
    ok = engine.generate("ok", {"max_new_tokens": 2, **GREEDY})
    assert ok["meta_info"]["completion_tokens"] == 2


def test_unknown_engine_argument(tiny_llama):
    with pytest.raises(ValueError, match="bogus"):
        Engine(str(tiny_llama), bogus=1)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "step by step"])
def test_retraction_keeps_every_request(tiny_llama, overlap):
    """A KV pool too small for all requests at once: some are retracted and re-queued,
    every request still finishes with the same greedy output as alone."""
    prompts = [f"Request number {i} says" for i in range(6)]
    params = {"max_new_tokens": 60, **GREEDY}
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=4000) as roomy:
        expected = [r["output_ids"] for r in roomy.generate(prompts, params)]
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=260,
                max_running_requests=6, enable_overlap_schedule=overlap,
                disable_overlap_schedule=not overlap) as tight:
        got = tight.generate(prompts, params)
        settle(tight)
        assert tight.scheduler.num_retractions > 0
    assert [r["output_ids"] for r in got] == expected
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in got)


def test_n_samples_with_one_seed_differ_and_repeat(engine):
    params = {"max_new_tokens": 12, "temperature": 1.0, "n": 3, "seed": 5}
    first = [r["output_ids"] for r in engine.generate("Once upon a time", params)]
    again = [r["output_ids"] for r in engine.generate("Once upon a time", params)]
    assert first == again
    assert len({tuple(ids) for ids in first}) == 3
    settle(engine)


def test_server_seed_makes_unseeded_sampling_repeat(tiny_llama):
    """--seed: requests without a seed draw from the server's generator, so the same requests
    in the same order give the same outputs, and another server seed other ones."""
    def run(seed: int) -> list[list[int]]:
        with Engine(str(tiny_llama), dtype="float32", max_total_tokens=1000, seed=seed) as eng:
            params = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}
            return [eng.generate(p, params)["output_ids"] for p in ("Once upon", "A small")]

    first = run(5)
    assert run(5) == first
    assert run(6) != first
