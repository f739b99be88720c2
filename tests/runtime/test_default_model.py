"""The default model (SmolLM2-135M-Instruct): greedy outputs token-identical to Hugging Face
transformers in fp32 for 8 prompts x 32 tokens, a sensible chat answer at each CPU level, and its int4
weights (quantization auto) as close to fp32 as bf16 weights are."""

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


def _levels() -> list:
    from radixflow.kernels.cpu.features import supported_levels

    return supported_levels()


@pytest.mark.parametrize("level", _levels())
def test_chat_answer_at_each_cpu_level(default_model_path, level):
    """What each CPU level serves by default (avx512: bf16 with int4 layers and the C step;
    avx2: fp32 with int4 layers and the C step; generic: fp32 torch ops) answers sensibly."""
    with Engine(None, max_total_tokens=4096, cpu_isa=level) as engine:
        info = engine.scheduler.model_info()
        # the GGUF's layer weights are 4-bit groups: where radixflow's kernels run,
        # quantization auto serves them as such
        assert info["quantization"] == ("none" if level == "generic" else "int4")
        assert info["dtype"] == ("bfloat16" if level == "avx512" else "float32")
        assert info["cpu"]["level"] == level
        assert info["cpu"]["decode_step"] == ("torch ops" if level == "generic" else "C")
        tok = engine.tokenizer
        prompt = tok.apply_chat_template(
            # NOTE: not the bare question: its first token is a coin flip even in fp32 ("The"
            # leads "L" by 0.08 nats), so any change of numerics flips the answer.
            [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
            tokenize=False, add_generation_prompt=True)
        res = engine.generate(prompt, {"max_new_tokens": 30, "temperature": 0})
    assert "Paris" in res["text"]
    assert res["meta_info"]["finish_reason"]["type"] == "stop"


PASSAGE = (
    "The river starts high in the mountains, where snow melts in the spring and runs down "
    "through narrow valleys. By the time it reaches the plains it is wide and slow, and towns "
    "have grown along both banks. For centuries boats carried grain, timber and wool to the "
    "coast, and the river was the main road of the region. Railways took most of that trade "
    "in the nineteenth century, but the old harbours are still there, and in summer they fill "
    "with small sailing boats and visitors who walk along the water in the evening. Fishing "
    "is allowed in some places, and the water is cleaner now than it has been for a hundred "
    "years, because the factories that once stood on the banks have closed or moved away."
)


def _prompt_logprobs(**engine_args) -> tuple[torch.Tensor, list[int]]:
    """Teacher-forced log-probabilities of PASSAGE's tokens, and the top-1 token at each."""
    # prefill chunks of 4 tokens: within the rows the int4 kernel serves (bf16 weights beyond)
    with Engine(None, max_total_tokens=4096, chunked_prefill_size=4, **engine_args) as engine:
        res = engine.generate(PASSAGE, {"max_new_tokens": 1, "temperature": 0},
                              return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
        info = res["meta_info"]
        return (torch.tensor([lp for lp, _, _ in info["input_token_logprobs"][1:]]),
                [top[0][1] for top in info["input_top_logprobs"][1:]])


def test_int4_weights_are_as_close_to_fp32_as_bf16(default_model_path):
    ref, ref_top = _prompt_logprobs(dtype="float32")
    errors = {}
    for name, args in {"bf16": {"dtype": "bfloat16", "quantization": "none"}, "int4": {}}.items():
        logprobs, top = _prompt_logprobs(**args)
        agree = sum(a == b for a, b in zip(top, ref_top)) / len(top)
        errors[name] = (logprobs - ref).abs().mean().item()
        assert agree >= 0.95, (name, agree)
    # bench/quality.py measured bf16 0.0375, int4 0.0401 mean |d logprob| (975 tokens)
    assert errors["int4"] <= 1.5 * errors["bf16"] + 0.01, errors
