"""RoPE scalings equal transformers' ROPE_INIT_FUNCTIONS: inverse frequencies, the attention
factor, and the cos/sin tables (factor folded in) against HF's rotary embedding modules."""

from __future__ import annotations

import importlib

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.models.config import ModelArgs
from radixflow.runtime.models.rope import RotaryEmbedding, rope_frequencies
from radixflow.runtime.models.rope_scaling import rope_settings


def _factors(n: int, step: float) -> list[float]:
    return [1.0 + step * i for i in range(n)]


PHI3_SHORT, PHI3_LONG = _factors(48, 0.05), _factors(48, 1.5)  # head_dim / 2 = 48 entries

# name -> (config class, config.json fields); each a real family's shape
CASES = {
    "qwen2.5-yarn4": ("Qwen2Config", dict(
        hidden_size=5120, num_attention_heads=40, rope_theta=1e6, max_position_embeddings=32768,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})),
    "deepseek-mscale": ("LlamaConfig", dict(
        hidden_size=2048, num_attention_heads=16, head_dim=128, rope_theta=10000.0,
        max_position_embeddings=163840,
        rope_scaling={"rope_type": "yarn", "factor": 40.0, "mscale": 0.707,
                      "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1,
                      "original_max_position_embeddings": 4096})),
    "yarn-untruncated-attn": ("LlamaConfig", dict(
        hidden_size=2880, num_attention_heads=64, head_dim=64, rope_theta=150000.0,
        max_position_embeddings=131072,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": False, "attention_factor": 1.2,
                      "original_max_position_embeddings": 4096})),
    "yarn-no-factor": ("LlamaConfig", dict(
        hidden_size=1024, num_attention_heads=8, rope_theta=10000.0,
        max_position_embeddings=16384,
        rope_scaling={"rope_type": "yarn", "factor": None,
                      "original_max_position_embeddings": 4096})),
    "phi3-longrope": ("Phi3Config", dict(
        hidden_size=3072, num_attention_heads=32, rope_theta=10000.0,
        max_position_embeddings=131072, original_max_position_embeddings=4096,
        rope_scaling={"type": "longrope", "short_factor": PHI3_SHORT,
                      "long_factor": PHI3_LONG})),
    "llama-longrope-factor": ("LlamaConfig", dict(
        hidden_size=3072, num_attention_heads=24, rope_theta=250000.0,
        max_position_embeddings=131072,
        rope_scaling={"rope_type": "longrope", "factor": 16.0, "short_factor": _factors(64, 0.02),
                      "long_factor": _factors(64, 0.9),
                      "original_max_position_embeddings": 8192})),
    "dynamic": ("LlamaConfig", dict(
        hidden_size=2048, num_attention_heads=16, rope_theta=10000.0,
        max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.0})),
    "linear": ("LlamaConfig", dict(
        hidden_size=1024, num_attention_heads=16, rope_theta=10000.0,
        max_position_embeddings=8192, rope_scaling={"type": "linear", "factor": 4.0})),
    "llama3": ("LlamaConfig", dict(
        hidden_size=4096, num_attention_heads=32, rope_theta=500000.0,
        max_position_embeddings=131072,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
}
_BASE = dict(vocab_size=32, intermediate_size=64, num_hidden_layers=1)


def _hf_config(case: str):
    cls, fields = CASES[case]
    return getattr(transformers, cls)(**_BASE, **fields)


def _ours(case: str, seq_len: int | None = None, context_len: int | None = None):
    cls, fields = CASES[case]
    config = {**_BASE, **fields, "architectures": [cls.replace("Config", "ForCausalLM")]}
    rope = rope_settings(config)
    head_dim = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    return rope_frequencies(head_dim, rope.theta, rope.scaling,
                            seq_len=seq_len or fields["max_position_embeddings"],
                            context_len=context_len)


@pytest.mark.parametrize("case", sorted(CASES))
def test_inv_freq_and_attention_factor_equal_transformers(case):
    hf = _hf_config(case)
    kind = hf.rope_parameters["rope_type"]
    ref, ref_factor = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
    inv_freq, factor = _ours(case, context_len=CASES[case][1].get(
        "original_max_position_embeddings", 4096) if kind == "longrope" else None)
    torch.testing.assert_close(inv_freq.float(), ref.float(), rtol=2e-6, atol=0)
    assert factor == pytest.approx(ref_factor, rel=1e-12)


@pytest.mark.parametrize("case", ["phi3-longrope", "llama-longrope-factor"])
def test_longrope_long_factors_past_the_original_length(case):
    hf = _hf_config(case)
    original = hf.rope_parameters["original_max_position_embeddings"]
    ref, ref_factor = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=original + 1)
    inv_freq, factor = _ours(case, context_len=original + 1)
    torch.testing.assert_close(inv_freq.float(), ref.float(), rtol=2e-6, atol=0)
    assert factor == pytest.approx(ref_factor) and factor > 1.0
    short, _ = _ours(case, context_len=original)  # a server whose context fits: short factors
    assert not torch.allclose(short, inv_freq)


def test_dynamic_ntk_past_max_positions_equals_transformers():
    hf = _hf_config("dynamic")
    ref, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=10000)
    inv_freq, _ = _ours("dynamic", seq_len=10000)
    torch.testing.assert_close(inv_freq.float(), ref.float(), rtol=2e-6, atol=0)
    # within max_position_embeddings (all radixflow serves) it is plain RoPE, as in HF
    plain, _ = rope_frequencies(128, 10000.0, None, seq_len=4096)
    torch.testing.assert_close(_ours("dynamic")[0], plain)


@pytest.mark.parametrize("case", ["qwen2.5-yarn4", "deepseek-mscale", "phi3-longrope"])
def test_tables_fold_the_attention_factor_like_hf(case):
    hf = _hf_config(case)
    family = hf.model_type  # qwen2, llama, phi3: their own rotary embedding modules
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    hf_rope = next(v for k, v in vars(module).items() if k.endswith("RotaryEmbedding"))(hf)
    cls, fields = CASES[case]
    args = ModelArgs.from_hf_config({**_BASE, **fields,
                                     "architectures": [cls.replace("Config", "ForCausalLM")]})
    positions = torch.tensor([0, 1, 7, 100, 4095, 4096, 5000])
    ours = RotaryEmbedding(args.head_dim, 5001, args.rope_theta, args.rope_scaling)
    x = torch.zeros(1, positions.numel(), args.head_dim)
    # HF picks longrope's factors per forward (long here: positions past 4096)
    cos, sin = hf_rope(x, positions[None])
    # (HF's fp32 angles are off by ~position * 2**-24 radians; ours are taken in fp64)
    torch.testing.assert_close(ours.cos[positions], cos[0], rtol=0, atol=1e-3)
    torch.testing.assert_close(ours.sin[positions], sin[0], rtol=0, atol=1e-3)
    near_cos, near_sin = hf_rope(x, torch.arange(101)[None])  # longrope: short factors
    ours.reset_tables(context_len=4096)  # a server whose context fits the original length
    torch.testing.assert_close(ours.cos[:101], near_cos[0], rtol=0, atol=2e-5)
    torch.testing.assert_close(ours.sin[:101], near_sin[0], rtol=0, atol=2e-5)
    assert ours.attention_factor != 1.0


def test_parsing():
    base = {**_BASE, "hidden_size": 64, "num_attention_heads": 4}
    su = {**base, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 64,
          "rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                           "original_max_position_embeddings": 32}}
    assert rope_settings(su).scaling["rope_type"] == "longrope"
    phi3 = {**su, "architectures": ["Phi3ForCausalLM"], "rope_scaling": {
        "type": "yarn", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}}
    scaling = rope_settings(phi3).scaling  # Phi3Config's own mapping, and its 4096 default
    assert scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == 4096
    new_style = {**base, "max_position_embeddings": 40960, "rope_parameters": {
        "rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
        "original_max_position_embeddings": 32768}}
    rope = rope_settings(new_style)
    assert rope.theta == 1e6 and rope.max_positions == 131072  # yarn serves original * factor
    assert rope_settings({**base, "rope_parameters": {"rope_theta": 5.0,
                                                      "rope_type": "default"}}).scaling is None
    with pytest.raises(InvalidRequest, match="'mrope'.*supported: default, linear, dynamic"):
        rope_settings({**base, "rope_scaling": {"type": "mrope"}})
    with pytest.raises(InvalidRequest, match="longrope.*short_factor"):
        rope_settings({**base, "rope_scaling": {"type": "longrope", "long_factor": [1.0]}})
