"""--enable-torch-compile: the compiled single-request decode step against the eager model."""

from __future__ import annotations

import torch

from radixflow.runtime.engine import Engine

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}


def _run(folder, **args) -> tuple[dict, int]:
    with Engine(str(folder), dtype="float32", max_total_tokens=512, **args) as engine:
        res = engine.generate("The quick brown fox", GREEDY, return_logprob=True)
        # its prompt comes from the cache and its new slots do not follow on from it
        shared = engine.generate("The quick brown fox jumps", GREEDY)
        assert shared["meta_info"]["cached_tokens"] > 0
        # a batch of two is not the compiled case: it must still be served, eagerly
        batch = engine.generate(["one", "two"], GREEDY)
        compiled = engine.scheduler.runner.compiled_decode
        engine.scheduler.check_slots()
        return (res | {"batch": [r["output_ids"] for r in batch], "shared": shared["output_ids"]},
                compiled.calls if compiled else 0)


def test_compiled_decode_matches_the_eager_model(tiny_llama):
    eager, _ = _run(tiny_llama)
    compiled, calls = _run(tiny_llama, enable_torch_compile=True)
    assert calls == 2 * (GREEDY["max_new_tokens"] - 1)  # every decode step of both single requests
    assert compiled["output_ids"] == eager["output_ids"]
    assert compiled["batch"] == eager["batch"]
    assert compiled["shared"] == eager["shared"]

    def lp(r):
        return torch.tensor([x[0] for x in r["meta_info"]["output_token_logprobs"]])

    torch.testing.assert_close(lp(compiled), lp(eager), atol=1e-4, rtol=1e-4)
