"""The engine's greedy outputs are the same with the Triton attention backend (run on the CPU
by the interpreter) as with torch_native, through chunked prefill, batching and prefix reuse."""

from __future__ import annotations

import pytest
from helpers.tiny_models import make_tiny_model
from radixflow.runtime.engine import Engine

PROMPTS = ["The quick brown fox", "The quick brown fox jumps over the lazy dog. A small",
           "1 2 3 4 5 6 7 8 9 10"]
BACKEND_CLASSES = {"triton": "TritonAttnBackend", "torch_native": "TorchNativeAttnBackend"}
PARAMS = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


def greedy_outputs(folder, backend):
    with Engine(str(folder), dtype="float32", device="cpu", attention_backend=backend,
                max_total_tokens=1024, chunked_prefill_size=8, max_prefill_tokens=16) as engine:
        assert type(engine.scheduler.runner.attn).__name__ == BACKEND_CLASSES[backend]
        first = [r["output_ids"] for r in engine.generate(PROMPTS, PARAMS)]
        again = engine.generate(PROMPTS, PARAMS)  # prefixes now come from the radix cache
        assert all(r["meta_info"]["cached_tokens"] > 0 for r in again)
        engine.scheduler.check_slots()
        return first, [r["output_ids"] for r in again]


def test_triton_backend_greedy_outputs_match_torch_native(tiny_llama):
    want = greedy_outputs(tiny_llama, "torch_native")
    got = greedy_outputs(tiny_llama, "triton")
    assert got == want
    assert want[0] == want[1]
