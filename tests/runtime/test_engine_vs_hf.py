"""Greedy outputs token-identical to Hugging Face transformers (fp32), every architecture,
through batching, chunked prefill and the prefix cache."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers.family_models import hf_greedy_ids
from helpers.tiny_models import ARCHS

from radixflow.runtime.engine import Engine
from radixflow.runtime.model_loader.hf_folder import transformers_model

PROMPTS = [
    "The quick brown fox",
    "A small model reads a short prompt and writes",
    "The cache keeps every prefix that two requests share, so the",
    "{\"name\": \"Ada\", \"age\":",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "The quick brown fox jumps over the lazy dog. A small",
]
NEW_TOKENS = 24


def hf_greedy(folder, prompts, max_new_tokens):
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers_model(folder, torch.float32)
    return hf_greedy_ids(model, tok, prompts, max_new_tokens), model, tok


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_hf(tiny_model_factory, arch):
    folder = tiny_model_factory(arch)
    expected, model, tok = hf_greedy(folder, PROMPTS, NEW_TOKENS)
    # small chunks and a small budget: prompts are prefilled over several steps, mixed with decodes
    with Engine(str(folder), dtype="float32", max_total_tokens=4096, chunked_prefill_size=7,
                max_prefill_tokens=16) as engine:
        params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
        results = engine.generate(PROMPTS, params)
        assert [r["output_ids"] for r in results] == expected
        again = engine.generate(PROMPTS, params)  # now served from the radix cache
        assert [r["output_ids"] for r in again] == expected
        assert all(r["meta_info"]["cached_tokens"] > 0 for r in again)
        engine.scheduler.check_slots()

    # logits, not just argmax: prompt logprobs agree with HF's log_softmax
    with Engine(str(folder), dtype="float32", max_total_tokens=1024) as engine:
        res = engine.generate(PROMPTS[2], {"max_new_tokens": 0}, return_logprob=True,
                              logprob_start_len=0)
        ours = [e[0] for e in res["meta_info"]["input_token_logprobs"][1:]]
    ids = tok(PROMPTS[2], return_tensors="pt").input_ids
    with torch.no_grad():
        ref = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    ref = ref.gather(1, ids[0, 1:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(ours), ref, atol=1e-4, rtol=1e-4)
