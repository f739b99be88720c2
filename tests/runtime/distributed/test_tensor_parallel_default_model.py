"""The default model (SmolLM2-135M-Instruct: 9 heads, 3 KV heads) split over 3 ranks: fp32
greedy output token-identical to --tp-size 1 for 8 prompts x 32 tokens, prompt logprobs
within 1e-4; and what --quantization auto serves split (int4 layers on each rank's shard,
decode as torch ops) answers as the unsplit model does."""

from __future__ import annotations

import pytest
from helpers.default_prompts import PROMPTS

from radixflow.runtime.engine import Engine

pytestmark = pytest.mark.e2e

GREEDY = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}


def _run(engine) -> tuple[list[list[int]], list[list[float]]]:
    out = engine.generate(PROMPTS, GREEDY)
    lp = engine.generate(PROMPTS, {"max_new_tokens": 0}, return_logprob=True,
                         logprob_start_len=0)
    engine.scheduler.check_slots()
    return ([r["output_ids"] for r in out],
            [[e[0] for e in r["meta_info"]["input_token_logprobs"][1:]] for r in lp])


@pytest.fixture(scope="module")
def unsplit_fp32(default_model_path):
    with Engine(None, dtype="float32", max_total_tokens=4096) as one:
        return _run(one)


def test_tp3_fp32_is_token_identical(unsplit_fp32):
    ids_1, lps_1 = unsplit_fp32
    with Engine(None, dtype="float32", max_total_tokens=4096, tp_size=3) as three:
        runner = three.scheduler.runner
        assert runner.kv_pool.k[0].shape[1] == 1 and runner.cpu_decode is None
        ids_3, lps_3 = _run(three)
    assert ids_3 == ids_1
    assert max(abs(a - b) for x, y in zip(lps_1, lps_3) for a, b in zip(x, y)) < 1e-4


def test_tp3_quantization_auto_runs_int4_shards(unsplit_fp32):
    """The GGUF's layers are 4-bit groups: each rank's shard is too (the groups run along
    the input features and the splits fall on group boundaries), so int4 stays lossless;
    the prompt logprobs differ from fp32's by bf16 arithmetic only."""
    from radixflow.kernels import cpu as cpu_kernels
    from radixflow.runtime.models.quant_linear import Int4Linear

    if not cpu_kernels.available():
        pytest.skip("radixflow's CPU kernels do not run here: quantization auto is none")
    _, lps_1 = unsplit_fp32
    with Engine(None, max_total_tokens=4096, tp_size=3) as three:
        runner = three.scheduler.runner
        assert runner.quantization == "int4"
        down = runner.model.layers[0].mlp.down_proj
        assert isinstance(down, Int4Linear) and down.in_features == 1536 // 3
        lp = three.generate(PROMPTS, {"max_new_tokens": 0}, return_logprob=True,
                            logprob_start_len=0)
    diffs = [abs(a - e[0]) for x, r in zip(lps_1, lp)
             for a, e in zip(x, r["meta_info"]["input_token_logprobs"][1:])]
    print(f"int4/bf16 TP=3 vs fp32 TP=1 prompt logprobs: mean |diff| "
          f"{sum(diffs) / len(diffs):.4f}, max {max(diffs):.4f}")
    assert sum(diffs) / len(diffs) < 0.1
