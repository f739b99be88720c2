"""End to end: tiny random Llamas with YaRN and longrope scaling, prompts past the original
context length, served by radixflow.Engine token-identical to transformers (fp32 greedy) and
with prompt logprobs within 1e-4."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers.family_models import NEW_TOKENS, check_engine_matches
from helpers.tiny_models import make_tiny_model

from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.model_runner import BatchRequest, ModelRunner
from radixflow.runtime.server_args import ServerArgs

ORIGINAL, MAX_POS = 32, 64
LONG_PROMPTS = [  # 34 to 47 tokens: past the original 32
    "Once upon a time there was a little robot who lived in a library. Every morning it",
    "The quick brown fox jumps over the lazy dog. A small model reads a short prompt and "
    "writes an answer",
    "Punctuation: , . ; : ! ? ( ) [ ] { } < > / | - _ = +",
]
SHORT_PROMPTS = ["The quick brown fox", "def add(a, b):\n    return"]
SCALINGS = {
    "yarn": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 8.0, "beta_slow": 1.0,
             "original_max_position_embeddings": ORIGINAL},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.8, "mscale_all_dim": 1.2,
                    "original_max_position_embeddings": ORIGINAL},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": ORIGINAL,
                 "short_factor": [1.0 + 0.1 * i for i in range(8)],
                 "long_factor": [1.0 + 1.7 * i for i in range(8)]},  # head_dim 16
}


@pytest.fixture(scope="module", params=sorted(SCALINGS))
def scaled_model(request, tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp(f"rope-{request.param}"), "llama",
                             max_position_embeddings=MAX_POS,
                             rope_scaling=dict(SCALINGS[request.param]))
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return request.param, folder, tok, model.eval()


def test_long_prompts_match_hf(scaled_model):
    kind, folder, tok, model = scaled_model
    assert all(len(tok(p).input_ids) + NEW_TOKENS <= MAX_POS for p in LONG_PROMPTS)
    assert all(len(tok(p).input_ids) > ORIGINAL for p in LONG_PROMPTS)
    # (longrope on a 64-token server uses the long factors, as HF does past 32 tokens)
    check_engine_matches(folder, model, tok,
                         LONG_PROMPTS + (SHORT_PROMPTS if kind != "longrope" else []))


def test_tensor_parallel_ranks_build_the_same_tables(scaled_model):
    kind, folder, tok, model = scaled_model
    if kind == "yarn":
        pytest.skip("yarn-mscale and longrope cover it")
    check_engine_matches(folder, model, tok, LONG_PROMPTS, tp_size=2)


def test_longrope_short_context_server_uses_short_factors(scaled_model):
    kind, folder, tok, model = scaled_model
    if kind != "longrope":
        pytest.skip("longrope only")
    # every sequence fits the original 32 positions: HF uses the short factors throughout
    check_engine_matches(folder, model, tok, SHORT_PROMPTS, context_length=ORIGINAL)


def test_c_decode_step_takes_the_scaled_tables(scaled_model):
    """The C decode step (int4 models) reads rope.cos/sin, attention factor folded in: its
    logits past the original length are the eager step's."""
    kind, folder, tok, _ = scaled_model
    config = json.loads((folder / "config.json").read_text())
    runner = ModelRunner(ServerArgs(model=str(folder), max_total_tokens=256, dtype="float32",
                                    quantization="int4"), folder, config)
    assert runner.cpu_decode is not None
    assert runner.model.rope.attention_factor != 1.0
    tokens = tok(LONG_PROMPTS[1]).input_ids
    slots = runner.kv_pool.alloc(len(tokens))
    runner.req_to_token_pool.req_to_token[0, :len(tokens)] = slots.to(torch.int32)

    def step(i: int) -> torch.Tensor:
        part = BatchRequest(req_pool_idx=0, ids=[tokens[i]], start_pos=i, logit_offsets=[0])
        return runner.forward(ForwardMode.DECODE, [part], slots[i:i + 1])

    calls = runner.cpu_decode.calls
    c_step = torch.cat([step(i) for i in range(len(tokens))])  # writes the K/V as it goes
    assert runner.cpu_decode.calls - calls == len(tokens)
    runner.cpu_decode = None
    eager = torch.cat([step(i) for i in range(len(tokens))])
    # (the C step's own rounding: ~0.6% of the largest logit, scaled or not; tables without
    # the attention factor: 17-27%)
    assert (c_step - eager).abs().max() <= 0.03 * eager.abs().max()
