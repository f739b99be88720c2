"""The default model (SmolLM2-135M-Instruct): greedy outputs token-identical to Hugging Face
transformers in fp32 for 8 prompts x 32 tokens, and a sensible bf16 chat answer."""

from __future__ import annotations

import pytest
import torch
import transformers

from radixflow.runtime.engine import Engine

pytestmark = pytest.mark.e2e

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "<|im_start|>user\nName a fruit that is yellow.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5,",
    "A haiku about the sea:",
]


def test_greedy_matches_hf_fp32(default_model_path):
    tok = transformers.AutoTokenizer.from_pretrained(default_model_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(default_model_path,
                                                          dtype=torch.float32).eval()
    expected = []
    for p in PROMPTS:
        ids = tok(p, return_tensors="pt").input_ids
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                              do_sample=False, eos_token_id=None, pad_token_id=2)
        expected.append(out[0, ids.shape[1]:].tolist())
    with Engine(None, dtype="float32", max_total_tokens=4096) as engine:
        results = engine.generate(PROMPTS, {"max_new_tokens": 32, "temperature": 0,
                                            "ignore_eos": True})
        engine.scheduler.check_slots()
    assert [r["output_ids"] for r in results] == expected


def test_bf16_chat_answer(default_model_path):
    with Engine(None, max_total_tokens=4096) as engine:  # dtype auto: bf16 on this CPU
        tok = engine.tokenizer
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            tokenize=False, add_generation_prompt=True)
        res = engine.generate(prompt, {"max_new_tokens": 30, "temperature": 0})
    assert "Paris" in res["text"]
    assert res["meta_info"]["finish_reason"]["type"] == "stop"
