"""Overlapped decoding (runtime/scheduler/decode.py) gives every request exactly the tokens,
logprobs and finish of the step-by-step scheduler, whatever ends it mid-flight (stops, EOS,
grammars and their jumps, budget-safe closing, aborts), and leaks no KV slot."""

from __future__ import annotations

import json
import threading

import pytest
from helpers.engine_checks import settle

from radixflow.runtime.engine import Engine

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "pet": {"enum": ["cat", "dog", "parrot"]}},
          "required": ["name", "pet"], "additionalProperties": False}
LOOPY = {"type": "object",  # sampled hot, it runs long: the budget closes it early
         "properties": {"id": {"type": "string"}, "n": {"type": "integer"},
                        "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["id", "n", "tags"], "additionalProperties": False}
PROMPTS = ["The quick brown fox", "Please answer in JSON:", "Once upon a time", "a b c",
           "Numbers: 1 2 3", "Hello"]


def _requests() -> tuple[list[str], list[dict]]:
    """One batch whose requests end at different steps, for different reasons."""
    greedy = {"temperature": 0}
    params = [
        {"max_new_tokens": 24, "ignore_eos": True, **greedy},
        {"max_new_tokens": 3, "ignore_eos": True, **greedy},  # ends while others run
        {"max_new_tokens": 40, "json_schema": json.dumps(SCHEMA), **greedy},  # jumps
        *({"max_new_tokens": 40, "json_schema": json.dumps(LOOPY), "temperature": 1.5,
           "seed": seed} for seed in range(3)),
        {"max_new_tokens": 30, "regex": r"(yes|no)( [a-z]{1,4}){1,5}\.", **greedy},
        {"max_new_tokens": 20, "temperature": 1.0, "seed": 7, "ignore_eos": True},
        {"max_new_tokens": 16, "stop": [" the", "e"], **greedy},
        {"max_new_tokens": 16, "stop_token_ids": [5, 6, 7, 8, 9, 10, 11, 12], **greedy},
        {"max_new_tokens": 12, "min_new_tokens": 4, **greedy},
    ]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    return prompts, params


@pytest.fixture(scope="module")
def engines(tiny_llama):
    args = dict(dtype="float32", max_total_tokens=3000, max_running_requests=16)
    with Engine(str(tiny_llama), enable_overlap_schedule=True, **args) as on, \
            Engine(str(tiny_llama), disable_overlap_schedule=True, **args) as off:
        assert on.scheduler.overlap and not off.scheduler.overlap
        yield on, off


def _strip(out: dict) -> dict:
    meta = out["meta_info"]
    return {"ids": out["output_ids"], "finish": meta["finish_reason"],
            "closed_early": meta.get("closed_early"),
            "top": [[t[1] for t in top] for top in meta["output_top_logprobs"]]}


def _logprobs(out: dict) -> list[float]:
    return [t[0] for t in out["meta_info"]["output_token_logprobs"]]


def test_a_mixed_batch_matches_the_step_by_step_scheduler(engines):
    on, off = engines
    prompts, params = _requests()
    threads = set()
    forward = on.scheduler.runner.forward

    def recording(*args):
        threads.add(threading.current_thread().name)
        return forward(*args)

    on.scheduler.runner.forward = recording
    try:
        got = on.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
    finally:
        on.scheduler.runner.forward = forward
    want = off.generate(prompts, params, return_logprob=True, top_logprobs_num=2)
    assert [_strip(o) for o in got] == [_strip(o) for o in want]
    for a, b in zip(got, want):  # (a pass's rows differ: float sums may round differently)
        assert _logprobs(a) == pytest.approx(_logprobs(b), abs=1e-4, nan_ok=True)
    assert any(name.startswith("radixflow-forward") for name in threads)  # it did overlap
    assert any(o["meta_info"].get("closed_early") for o in got)
    settle(on)
    settle(off)


def test_requests_arriving_while_others_decode(engines):
    """Admission drains the pass in flight; the late requests' tokens are the same."""
    on, off = engines
    long = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    short = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    results = {}
    for name, eng in (("on", on), ("off", off)):
        stream = eng.generate(PROMPTS[0], long, stream=True)
        first = next(stream)
        late = eng.generate(PROMPTS[1:4], short)
        rest = list(stream)
        results[name] = (first, rest[-1]["output_ids"] if rest else None,
                         [o["output_ids"] for o in late])
        settle(eng)
    assert results["on"][1:] == results["off"][1:]


def test_an_abandoned_stream_leaks_no_slot(engines):
    on, _ = engines
    stream = on.generate(PROMPTS[2], {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    for _ in range(3):
        next(stream)
    stream.close()  # aborts it with a pass in flight
    settle(on)


def test_the_default_follows_the_cores(tiny_llama, monkeypatch):
    """On by default only where the forward leaves a core free; the flags force it."""
    import torch

    from radixflow.runtime.scheduler.scheduler import Scheduler
    from radixflow.runtime.server_args import ServerArgs

    def overlap(cores: int, **flags) -> bool:
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        sched = Scheduler.from_args(ServerArgs(model=str(tiny_llama), dtype="float32",
                                               max_total_tokens=500, **flags))
        sched.shutdown()
        return sched.overlap

    threads = torch.get_num_threads()
    assert overlap(threads) is False
    assert overlap(threads + 1) is True
    assert overlap(threads, enable_overlap_schedule=True) is True
    assert overlap(threads + 1, disable_overlap_schedule=True) is False
    with pytest.raises(ValueError, match="contradict"):
        ServerArgs(model=str(tiny_llama), enable_overlap_schedule=True,
                   disable_overlap_schedule=True)
