"""Granite, SmolLM3 and Phi-3 (families.py over the Llama blocks) against transformers in fp32:
a tiny random model of each, saved by transformers' own class, greedy output token-identical
and prompt logprobs within 1e-4 through radixflow.Engine; and the parts other paths need
(the C decode step's refusal, tensor-parallel shards of fused and biased weights)."""

from __future__ import annotations

import pytest
import torch
from helpers.family_models import (
    COMMON,
    FAMILIES,
    NEW_TOKENS,
    PROMPTS,
    check_engine_matches,
    hf_reference,
    make_family_model,
    write_family_gguf,
    write_llamacpp_gguf,
)

from radixflow.runtime.distributed.sharding import ShardSpec
from radixflow.runtime.engine import Engine
from radixflow.runtime.models.config import SUPPORTED_ARCHITECTURES, ModelArgs


@pytest.mark.parametrize("family", ["granite", "phi3", "smollm3"])
def test_family_matches_hf(tmp_path, family):
    folder, model, tok = make_family_model(tmp_path, family)
    check_engine_matches(folder, model, tok)


def test_phi4_mini_like_longrope_and_partial_rotary(tmp_path):
    """longrope (rope_scaling.py) over 12 rotary dims: 6-entry factor lists; prompts past
    original_max_position_embeddings, where transformers uses the long factors."""
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [1.0 + 1.7 * i for i in range(6)]}
    folder, model, tok = make_family_model(tmp_path, "phi3", max_position_embeddings=64,
                                           original_max_position_embeddings=32,
                                           rope_parameters=rope)
    long_prompts = [  # 34 to 47 tokens
        "Once upon a time there was a little robot who lived in a library. Every morning it",
        "The quick brown fox jumps over the lazy dog. A small model reads a short prompt and "
        "writes an answer"]
    assert all(34 <= len(tok(p).input_ids) <= 64 - NEW_TOKENS for p in long_prompts)
    check_engine_matches(folder, model, tok, long_prompts)


def test_families_are_supported_architectures():
    for arch in ("GraniteForCausalLM", "SmolLM3ForCausalLM", "Phi3ForCausalLM"):
        assert arch in SUPPORTED_ARCHITECTURES


def _args(config: dict) -> ModelArgs:
    return ModelArgs.from_hf_config({**COMMON, "vocab_size": 300, **config})


def test_config_fields():
    granite = _args(dict(FAMILIES["granite"][1], architectures=["GraniteForCausalLM"]))
    assert granite.attn_scale == 0.1 and granite.logits_scaling == 4.0
    assert granite.o_proj_bias and granite.mlp_bias
    assert "residual_multiplier 0.5" in granite.fused_decode_gaps()[0]
    smol = _args(dict(architectures=["SmolLM3ForCausalLM"], num_hidden_layers=8))
    assert smol.nope_layers == (3, 7)  # every 4th layer, HF's default interval
    assert _args(dict(architectures=["SmolLM3ForCausalLM"],
                      no_rope_layers=[1, 0])).nope_layers == (1,)
    # Phi-4-mini's config.json keeps the factor at the top level; transformers 5 inside rope
    for where in ({"partial_rotary_factor": 0.75},
                  {"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.75}}):
        phi = _args(dict(architectures=["Phi3ForCausalLM"], **where))
        assert phi.rope_dim == 12 and phi.attn_scale == 16 ** -0.5
    llama = _args(dict(architectures=["LlamaForCausalLM"]))
    assert llama.fused_decode_gaps() == [] and llama.rope_dim == 16
    with pytest.raises(Exception, match="hidden_act"):
        _args(dict(architectures=["GraniteForCausalLM"], hidden_act="gelu"))


def test_sliding_windows_are_per_layer_and_do_not_cap_the_context():
    """Windows are attended as windows (test_sliding_window.py): the context stays
    max_position_embeddings."""
    phi = _args(dict(architectures=["Phi3ForCausalLM"], sliding_window=100))
    assert phi.window_layers == (0, 1) and phi.attn_window == 100
    assert phi.fused_decode_gaps() == []  # the C decode step attends windows too
    qwen = _args(dict(architectures=["Qwen2ForCausalLM"], sliding_window=64))
    assert qwen.window_layers == ()  # use_sliding_window false: full attention
    qwen = _args(dict(architectures=["Qwen2ForCausalLM"], sliding_window=64,
                      use_sliding_window=True, max_window_layers=1))
    assert (qwen.layer_window(0), qwen.layer_window(1)) == (None, 64)
    assert qwen.max_position_embeddings == 512 and qwen.fused_decode_gaps() == []


def test_tp_shards_fused_and_biased_weights():
    """Phi-3's fused qkv_proj / gate_up_proj shard as their parts would; a row-parallel bias
    is rank 0's alone (the all-reduce adds it once)."""
    a = _args(dict(architectures=["Phi3ForCausalLM"]))
    q, k, v = torch.randn(64, 8), torch.randn(32, 8), torch.randn(32, 8)
    gate, up = torch.randn(128, 8), torch.randn(128, 8)
    bias = torch.randn(64)
    for rank in range(2):
        spec = ShardSpec.create(a, 2, rank)
        fused = spec.shard("model.layers.0.self_attn.qkv_proj.weight", torch.cat([q, k, v]))
        parts = [spec.shard(f"model.layers.0.self_attn.{n}_proj.weight", t)
                 for n, t in (("q", q), ("k", k), ("v", v))]
        assert torch.equal(fused, torch.cat(parts))
        fused = spec.shard("model.layers.0.mlp.gate_up_proj.weight", torch.cat([gate, up]))
        parts = [spec.shard(f"model.layers.0.mlp.{n}_proj.weight", t)
                 for n, t in (("gate", gate), ("up", up))]
        assert torch.equal(fused, torch.cat(parts))
        for name in ("self_attn.o_proj.bias", "mlp.down_proj.bias"):
            got = spec.shard(f"model.layers.0.{name}", bias)
            assert torch.equal(got, bias if rank == 0 else torch.zeros_like(bias))


@pytest.mark.parametrize("family", ["granite", "phi3", "smollm3"])
def test_family_tp2_matches_hf(tmp_path, family):
    """Split over two ranks: Granite's row-parallel biases, Phi-3's fused checkpoint tensors,
    SmolLM3's layers without RoPE and its tied embedding."""
    folder, model, tok = make_family_model(tmp_path, family)
    check_engine_matches(folder, model, tok, tp_size=2)


@pytest.mark.parametrize("family", ["granite", "smollm3"])
def test_compiled_decode_matches_hf(tmp_path, family):
    """--enable-torch-compile's decode step: multipliers, biases and NoPE layers."""
    folder, model, tok = make_family_model(tmp_path, family)
    expected, _ = hf_reference(model, tok, PROMPTS[:1])
    with Engine(str(folder), dtype="float32", max_total_tokens=512,
                enable_torch_compile=True) as engine:
        out = engine.generate(PROMPTS[0], {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                           "ignore_eos": True})
        assert engine.scheduler.runner.compiled_decode.calls == NEW_TOKENS - 1
    assert out["output_ids"] == expected[0]


def _write_phi3_gguf(folder, model, dest):
    """As llama.cpp's converter writes Phi-3: fused attn_qkv / ffn_up, rope.dimension_count
    the rotary width."""
    def extra(writer, c):
        head_dim = c.hidden_size // c.num_attention_heads
        writer.add_rope_dimension_count(int(head_dim * c.rope_parameters["partial_rotary_factor"]))

    return write_family_gguf(folder, model, dest, "phi3", extra)


def test_phi3_gguf_keeps_partial_rotary(tmp_path):
    """transformers' GGUF reader drops phi3.rope.dimension_count; gguf_families puts it back,
    so the converted folder computes what the HF folder does."""
    from radixflow.runtime.model_loader.gguf_convert import convert_gguf
    from radixflow.runtime.model_loader.hf_folder import load_config

    folder, model, tok = make_family_model(tmp_path / "hf", "phi3")
    gguf_path = _write_phi3_gguf(folder, model, tmp_path / "phi3.gguf")
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(gguf_path, converted)
    assert ModelArgs.from_hf_config(load_config(converted)).rope_dim == 12
    check_engine_matches(converted, model, tok)


# SmolLM3 from a GGUF: llama.cpp fixes its no-RoPE layers at every 4th (layer 3 of 0..3)
GGUF_OVERRIDES = {"granite": {}, "smollm3": {"num_hidden_layers": 4,
                                             "no_rope_layer_interval": 4}}


@pytest.mark.parametrize("family", ["granite", "smollm3"])
def test_llamacpp_gguf_matches_hf(tmp_path, family):
    """llama.cpp's granite (its *_scale keys, biases) and smollm3 (tied head) files, q/k rows
    permuted as its converter writes them, read by gguf_own_reader: the converted folder
    serves what the HF model computes, with the tokenizer rebuilt from the GGUF."""
    from radixflow.runtime.model_loader.gguf_convert import convert_gguf

    folder, model, tok = make_family_model(tmp_path / "hf", family, **GGUF_OVERRIDES[family])
    gguf_path = write_llamacpp_gguf(folder, model, tmp_path / f"{family}.gguf", family)
    converted = tmp_path / "converted"
    converted.mkdir()
    info = convert_gguf(gguf_path, converted)
    assert info["architecture"] == type(model).__name__
    assert info["tie_word_embeddings"] == model.config.tie_word_embeddings
    check_engine_matches(converted, model, tok)


def _c_step_runner(folder):
    import json

    from radixflow.runtime.model_runner import ModelRunner
    from radixflow.runtime.server_args import ServerArgs

    config = json.loads((folder / "config.json").read_text())
    return ModelRunner(ServerArgs(model=str(folder), max_total_tokens=256, quantization="int4"),
                       folder, config)


def _decode_logits(runner, tokens, row):
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

    slots = runner.kv_pool.alloc(len(tokens))
    runner.req_to_token_pool.req_to_token[row, :len(tokens)] = slots.to(torch.int32)
    out = [runner.forward(ForwardMode.DECODE, [BatchRequest(req_pool_idx=row, ids=[t],
                                                            start_pos=i, logit_offsets=[0])],
                          slots[i:i + 1]) for i, t in enumerate(tokens)]
    runner.kv_pool.free(slots)
    return torch.cat(out)


def test_c_decode_step_runs_phi3_and_declines_the_rest(tmp_path):
    """Phi-3 with full rotary is Llama's layout (its fused tensors loaded whole): the C step
    runs it, as the eager step would; Granite's multipliers, SmolLM3's NoPE layers and
    partial rotary it declines (model_runner then decodes with torch ops)."""
    from radixflow.kernels import cpu

    if not cpu.available():
        pytest.skip("radixflow's CPU kernels do not run here")
    folder, _, _ = make_family_model(tmp_path / "phi3", "phi3", partial_rotary_factor=1.0)
    runner = _c_step_runner(folder)
    assert runner.cpu_decode is not None
    tokens = [5, 17, 99, 3, 250, 42, 7, 300, 11, 64]
    c_step = _decode_logits(runner, tokens, row=0)
    assert runner.cpu_decode.calls == len(tokens)
    runner.cpu_decode = None
    eager = _decode_logits(runner, tokens, row=1)
    assert (c_step - eager).abs().max() < 0.05 * eager.abs().max()
    for family in ("granite", "smollm3", "phi3"):
        folder, _, _ = make_family_model(tmp_path / f"{family}-declined", family)
        assert _c_step_runner(folder).cpu_decode is None
