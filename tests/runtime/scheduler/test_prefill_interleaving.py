"""A long prompt arriving while others decode is computed in chunks of
--prefill-budget-while-decoding tokens, a decode step between chunks, so running streams keep
getting a token every step; with nothing decoding, a step takes up to --max-prefill-tokens."""

from __future__ import annotations

import pytest

from radixflow.runtime.messages import GenerateReq, TokenBatchOut
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler.scheduler import Scheduler
from radixflow.runtime.server_args import ServerArgs


def req(rid: str, input_ids: list[int], max_new_tokens: int) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=input_ids, sampling=SamplingParams(
        max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True))


def scheduler(tiny_llama, **args) -> tuple[Scheduler, list[tuple[str, int]]]:
    """A scheduler whose forward passes are logged as (mode, tokens)."""
    sched = Scheduler.from_args(ServerArgs(model=str(tiny_llama), dtype="float32",
                                           max_total_tokens=3000, **args))
    log: list[tuple[str, int]] = []
    forward = sched.runner.forward

    def logged(mode, parts, out_slots):
        log.append((mode.name, sum(len(p.ids) for p in parts)))
        return forward(mode, parts, out_slots)

    sched.runner.forward = logged
    return sched, log


def new_tokens(outbox, rid: str) -> int:
    return sum(len(o.new_ids) for msg in outbox if isinstance(msg, TokenBatchOut)
               for o in msg.outputs if o.rid == rid)


def test_a_long_prompt_is_chunked_between_decode_steps(tiny_llama):
    sched, log = scheduler(tiny_llama, prefill_budget_while_decoding=16,
                           chunked_prefill_size=1024)
    sched.step([req("stream", list(range(10, 20)), 40)])  # prefilled alone, then decoding
    sched.step([])
    log.clear()
    long_prompt = list(range(100, 200))
    per_step = [new_tokens(sched.step([req("long", long_prompt, 4)]), "stream")]
    while sched.by_rid["long"].computed_len < len(long_prompt):
        per_step.append(new_tokens(sched.step([]), "stream"))
    extends = [n for mode, n in log if mode == "EXTEND"]
    assert extends == [16] * 6 + [4], extends  # 100 tokens in chunks of 16
    assert per_step == [1] * len(extends)  # the stream got a token at every step
    while not sched.is_idle:
        sched.step([])
    sched.check_slots()


def test_with_nothing_decoding_a_step_takes_the_whole_prompt(tiny_llama):
    sched, log = scheduler(tiny_llama, prefill_budget_while_decoding=16,
                           chunked_prefill_size=1024)
    sched.step([req("a", list(range(100, 200)), 2), req("b", list(range(300, 350)), 2)])
    assert log[0] == ("EXTEND", 150)
    while not sched.is_idle:
        sched.step([])
    sched.check_slots()


def test_the_budget_defaults_by_device_and_is_checked(tiny_llama):
    sched, _ = scheduler(tiny_llama)
    assert sched.prefill_budget == 256  # a CPU's default
    assert scheduler(tiny_llama, max_prefill_tokens=100)[0].prefill_budget == 100
    with pytest.raises(ValueError, match="--prefill-budget-while-decoding must be > 0"):
        ServerArgs(model=str(tiny_llama), prefill_budget_while_decoding=0)
