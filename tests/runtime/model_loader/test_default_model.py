"""The default model (SmolLM2-135M-Instruct): greedy outputs token-identical to Hugging Face
transformers in fp32 for 8 prompts x 32 tokens, a sensible chat answer at each CPU level, and its
int4 weights (quantization auto) as close to fp32 as bf16 weights are."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers.default_prompts import PROMPTS

from radixflow.runtime.engine import Engine
from radixflow.runtime.model_loader.hf_folder import transformers_model

pytestmark = pytest.mark.e2e



def test_greedy_matches_hf_fp32(default_model_path):
    # One left-padded batch: transformers' generate one prompt at a time spent ~30 s here.
    tok = transformers.AutoTokenizer.from_pretrained(default_model_path, padding_side="left")
    hf = transformers_model(default_model_path, torch.float32)
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=tok.pad_token_id)
    expected = out[:, batch.input_ids.shape[1]:].tolist()
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


@pytest.fixture(scope="module")
def fp32_and_bf16_logprobs(default_model_path):
    ref, ref_top = _prompt_logprobs(dtype="float32")
    bf16, bf16_top = _prompt_logprobs(dtype="bfloat16", quantization="none")
    return ref, ref_top, (bf16 - ref).abs().mean().item(), _agreement(bf16_top, ref_top)


def _agreement(top: list[int], ref_top: list[int]) -> float:
    return sum(a == b for a, b in zip(top, ref_top)) / len(top)


# the top-1 agreement with fp32 each level's int4 path must keep on PASSAGE. avx2 quantizes
# the products' inputs to 8-bit groups (llama.cpp's scheme): over 1200 tokens bench.quality
# measured mean |d logprob| 0.054 and 96.8% top-1 (bf16 weights: 0.043, 96.7%); on this short
# passage it agrees on 94.4%.
MIN_AGREEMENT = {"avx512": 0.95, "avx2": 0.93}
BF16_ERROR_FLOOR = 0.04


@pytest.mark.parametrize("level", [lv for lv in _levels() if lv != "generic"])
def test_int4_weights_are_as_close_to_fp32_as_bf16(fp32_and_bf16_logprobs, level):
    ref, ref_top, bf16_error, bf16_agreement = fp32_and_bf16_logprobs
    assert bf16_agreement >= 0.95
    logprobs, top = _prompt_logprobs(cpu_isa=level)  # quantization auto: the GGUF's own int4
    int4_error = (logprobs - ref).abs().mean().item()
    assert _agreement(top, ref_top) >= MIN_AGREEMENT[level]
    # bench/quality.py measured bf16 0.043, int4 0.041 (avx512) / 0.054 (avx2) mean |d logprob|;
    # where oneDNN runs bf16 on AMX tiles the bf16 error is lower (0.032 on an AMX Xeon, int4
    # at avx2 unchanged at 0.060), so bf16's figure counts as at least BF16_ERROR_FLOOR
    assert int4_error <= 1.5 * max(bf16_error, BF16_ERROR_FLOOR) + 0.01, (int4_error, bf16_error)


def test_sglang_offline_calls_as_written():
    import radixflow

    engine = radixflow.Engine()
    try:
        out = engine.generate("The capital of France is", {"max_new_tokens": 8})
        assert 0 < out["meta_info"]["completion_tokens"] <= 8 and isinstance(out["text"], str)
        params = {"max_new_tokens": 4, "temperature": 0}
        batch = engine.generate(["The capital of France is", "1, 2, 3,"], params)
        assert " Paris" in batch[0]["text"] and len(batch) == 2
        ids = engine.tokenizer.encode("The capital of France is")
        by_ids = engine.generate(input_ids=[ids], sampling_params=params)
        assert by_ids[0]["output_ids"] == batch[0]["output_ids"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("level", [lv for lv in _levels() if lv != "generic"])
def test_long_prompt_through_the_prefill_kernel(default_model_path, level, monkeypatch):
    """A ~450-token prompt attends through kernels.cpu.prefill at each level with kernels (bf16
    at avx512, fp32 at avx2) and continues it as torch's attention does."""
    from radixflow.kernels.cpu import prefill
    from radixflow.runtime.attention import torch_native

    prompt = ", ".join(str(i) for i in range(1, 151)) + ","
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    plans = []
    original = torch_native.TorchNativeAttnBackend._plan_extend

    def spy(self, batch):
        plan = original(self, batch)
        plans.append(type(plan).__name__)
        return plan

    monkeypatch.setattr(torch_native.TorchNativeAttnBackend, "_plan_extend", spy)
    with Engine(None, max_total_tokens=4096, cpu_isa=level) as engine:
        through_kernel = engine.generate(prompt, params)
        assert plans[-1] == "_KernelExtendPlan"
        monkeypatch.setitem(prefill.MIN_PAIRS, level, 1 << 62)
        engine.flush_cache()
        through_torch = engine.generate(prompt, params)
        assert plans[-1] == "_ExtendPlan"
        engine.scheduler.check_slots()
    assert through_kernel["output_ids"] == through_torch["output_ids"]
    assert through_kernel["text"].startswith(" 151, 15")


@pytest.mark.parametrize("level", [lv for lv in _levels() if lv != "generic"])
def test_row_kernels_compute_what_the_torch_ops_compute(default_model_path, level):
    """A prompt's forward with its norms, rope and SiLU in kernels.cpu.rows scores every position
    as the same forward with torch ops does (the kernels round where torch rounds; the norm's
    sum order and the SiLU's exp may move a bf16 value by one step now and then). At avx2 the
    int4 products quantize x to 8-bit groups, where a last-bit change can flip a rounding: a
    single position then moves by up to that quantization's own error (bench.quality: ~0.5)."""
    from radixflow.kernels.cpu.rows import RowKernels
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

    with Engine(None, max_total_tokens=4096, cpu_isa=level) as engine:
        runner = engine.scheduler.runner
        kernels = runner.model.norm.rows
        assert isinstance(kernels, RowKernels)
        ids = engine.tokenizer.encode(PROMPTS[0] + " " + ", ".join(map(str, range(1, 80))))
        n = len(ids)
        row, slots = runner.req_to_token_pool.alloc(), runner.kv_pool.alloc(n)
        runner.req_to_token_pool.req_to_token[row, :n] = slots.to(torch.int32)
        logprobs = {}
        for way in (kernels, None):
            runner.model.bind_row_kernels(way)
            logits = runner.forward(ForwardMode.EXTEND, [BatchRequest(row, ids, 0, list(range(n)))],
                                    slots)
            logprobs[way is None] = torch.log_softmax(logits, dim=-1)
        runner.model.bind_row_kernels(kernels)
        runner.kv_pool.free(slots)
        runner.req_to_token_pool.free(row)
    ours, torchs = logprobs[False], logprobs[True]
    chosen = torch.tensor(ids[1:])[:, None]
    diff = (ours[:-1].gather(1, chosen) - torchs[:-1].gather(1, chosen)).abs()
    agree = (ours.argmax(-1) == torchs.argmax(-1)).float().mean()
    assert diff.mean() < 0.02 and diff.max() < 0.6, (diff.mean(), diff.max())
    assert agree > 0.97, agree
