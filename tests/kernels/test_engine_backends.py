"""The engine's greedy outputs are the same with the Triton attention and sampling kernels (on
the GPU, or on the CPU by the interpreter) as with the CPU path (torch_native attention, torch
sampling), through chunked prefill, batching and prefix reuse. (A seeded draw is the same
distribution on both, by different algorithms: CDF inversion in the kernel, the exponential
race on the CPU; tests/runtime/sampling and tests/kernels/test_sampling.py check each against
the kept set.)"""

from __future__ import annotations

import pytest
from helpers.tiny_models import make_tiny_model

from radixflow.kernels.triton import sampling as triton_sampling
from radixflow.runtime.engine import Engine

PROMPTS = ["The quick brown fox", "The quick brown fox jumps over the lazy dog. A small",
           "1 2 3 4 5 6 7 8 9 10"]
BACKEND_CLASSES = {"triton": "TritonAttnBackend", "torch_native": "TorchNativeAttnBackend"}
GREEDY = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
# A seeded row makes the batch mixed, so the sampling kernel draws every row (greedy ones too).
SEEDED = {"max_new_tokens": 5, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7,
          "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


def outputs(folder, attention_backend, sampling_backend, device="cpu"):
    with Engine(str(folder), dtype="float32", device=device, attention_backend=attention_backend,
                sampling_backend=sampling_backend, max_total_tokens=1024,
                chunked_prefill_size=8, max_prefill_tokens=16) as engine:
        assert type(engine.scheduler.runner.attn).__name__ == BACKEND_CLASSES[attention_backend]
        first = [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)]
        again = engine.generate(PROMPTS, GREEDY)  # prefixes now come from the radix cache
        assert all(r["meta_info"]["cached_tokens"] > 0 for r in again)
        mixed = engine.generate(PROMPTS + PROMPTS[:1], [GREEDY] * len(PROMPTS) + [SEEDED])
        engine.scheduler.check_slots()
        return first, [r["output_ids"] for r in again], [r["output_ids"] for r in mixed]


def test_triton_kernels_give_the_cpu_paths_tokens(tiny_llama, monkeypatch, kernel_device):
    draws = []
    kernel = triton_sampling.sample_from_logits_triton

    def counted_kernel(logits, *args, **kwargs):
        draws.append(logits.shape[0])
        return kernel(logits, *args, **kwargs)

    monkeypatch.setattr(triton_sampling, "sample_from_logits_triton", counted_kernel)
    want = outputs(tiny_llama, "torch_native", "torch")
    assert not draws
    got = outputs(tiny_llama, "triton", "triton", kernel_device.type)
    assert draws  # the mixed batch was sampled by the Triton kernel
    n = len(PROMPTS)
    assert got[:2] == want[:2] and got[2][:n] == want[2][:n]  # every greedy row, mixed ones too
    assert len(got[2][n]) == len(want[2][n]) == SEEDED["max_new_tokens"]
    first, again, mixed = want
    assert first == again == mixed[:n]


def test_triton_attention_verifies_drafted_tokens(tiny_llama, monkeypatch, kernel_device):
    """Speculative decoding's verify pass through the Triton kernels: a request's drafted
    tokens are rows of the decode pass, attending to each other's K/V written in that pass."""
    from helpers.spec_oracle import Oracle, every_draft_runs

    from radixflow.runtime.request_building import tokenize_prompt
    from radixflow.runtime.scheduler import speculate

    greedy = {**GREEDY, "max_new_tokens": 12}
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=1024) as engine:
        want = [r["output_ids"] for r in engine.generate(PROMPTS, greedy)]
        tok = engine.tokenizer
    monkeypatch.setattr(Oracle, "futures", [tokenize_prompt(tok, p) + w
                                            for p, w in zip(PROMPTS, want)])
    monkeypatch.setattr(Oracle, "wrong_at", 2)
    monkeypatch.setattr(speculate, "NgramDrafter", Oracle)
    every_draft_runs(monkeypatch)
    with Engine(str(tiny_llama), dtype="float32", device=kernel_device.type,
                attention_backend="triton", max_total_tokens=1024,
                speculative_algorithm="ngram") as engine:
        got = engine.generate(PROMPTS, greedy)
        engine.scheduler.check_slots()
    assert [r["output_ids"] for r in got] == want
    assert sum(r["meta_info"]["spec_accept_token_num"] for r in got) > 0
