"""Gemma 2 and Gemma 3 (text) against transformers in fp32, on one rank and split over two:
windows shorter than the prompts, soft-capping, Gemma 3's two RoPE bases and q/k norms; and
the paths that refuse them."""

from __future__ import annotations

import pytest
from helpers.family_models import COMMON, check_engine_matches, make_family_model, write_family_gguf

from radixflow.runtime.distributed.split import check_split
from radixflow.runtime.engine import Engine
from radixflow.runtime.models.config import ModelArgs

PROMPTS = ["The quick brown fox", "The cache keeps every prefix that two requests share, so the",
           "Once upon a time there was a little robot who lived in a library. Every morning it"]


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_gemma_matches_hf(tmp_path, family):
    folder, model, tok = make_family_model(tmp_path, family, tie_word_embeddings=True)
    check_engine_matches(folder, model, tok, PROMPTS)


@pytest.mark.parametrize(("family", "tp_size"), [("gemma2", 2), ("gemma3", 2), ("gemma3", 4)])
def test_gemma_tp_matches_hf(tmp_path, family, tp_size):
    """Split over two ranks (2 heads and 1 KV head each) or four (1 head each, each KV head
    on two ranks): windows, both soft-caps (the final one on each rank's vocab rows), Gemma 3's
    two RoPE bases and per-head q/k norms, the scaled vocab-parallel embedding tied to the
    head."""
    folder, model, tok = make_family_model(tmp_path, family, tie_word_embeddings=True)
    check_engine_matches(folder, model, tok, PROMPTS, tp_size=tp_size)


def test_gemma_refuses_fused_paths(tmp_path):
    folder, _, _ = make_family_model(tmp_path, "gemma3", tie_word_embeddings=True)
    with Engine(str(folder), dtype="float32", max_total_tokens=256,
                enable_torch_compile=True) as engine:
        runner = engine.scheduler.runner
        assert runner.cpu_decode is None and runner.compiled_decode is None
        assert len(engine.generate(PROMPTS[0], {"max_new_tokens": 4})["output_ids"]) == 4


def test_gemma_config_fields():
    base = {**COMMON, "vocab_size": 300, "head_dim": 16, "num_hidden_layers": 6}
    g2 = ModelArgs.from_hf_config({**base, "architectures": ["Gemma2ForCausalLM"],
                                   "sliding_window": 4096})
    assert g2.window_layers == (0, 2, 4) and g2.attn_softcap == 50.0
    assert g2.final_softcap == 30.0 and g2.attn_scale == 256 ** -0.5
    assert g2.max_position_embeddings == 512 and g2.fused_decode_gaps()
    assert g2.layer_window(0) == 4096 and g2.layer_window(1) is None
    # the hub's Gemma 3 configs: rope_theta, rope_local_base_freq, rope_scaling of the global
    g3 = ModelArgs.from_hf_config({**base, "architectures": ["Gemma3ForCausalLM"],
                                   "sliding_window": 512, "rope_local_base_freq": 10000.0,
                                   "rope_theta": 1e6, "query_pre_attn_scalar": 16,
                                   "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert g3.window_layers == (0, 1, 2, 3, 4) and g3.attn_softcap is None
    assert g3.rope_theta == 1e6 and g3.rope_local_theta == 10000.0 and g3.qk_norm
    assert g3.rope_scaling["factor"] == 8.0
    check_split(g3, 2)  # Gemma splits as Llama does; sizes that do not divide are named
    with pytest.raises(ValueError, match=r"--tp-size 3 cannot split this model "
                                         r"\(Gemma3ForCausalLM\): it does not divide its 4 "
                                         r"attention heads.*intermediate size 128"):
        check_split(g3, 3)


def _write_gemma2_gguf(folder, model, dest):
    """As llama.cpp's converter writes Gemma 2: norms stored as 1 + w, the softcaps and the
    window in the metadata, no query_pre_attn_scalar, the tied head left out."""
    def extra(writer, c):
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_float32("gemma2.attn_logit_softcapping", c.attn_logit_softcapping)
        writer.add_float32("gemma2.final_logit_softcapping", c.final_logit_softcapping)
        writer.add_sliding_window(c.sliding_window)

    def tensor(name, t):
        if name == "lm_head.weight":
            return None
        return t + 1 if name.endswith("norm.weight") else t

    return write_family_gguf(folder, model, dest, "gemma2", extra, tensor)


def test_gemma2_gguf_matches_hf(tmp_path):
    """A Gemma 2 GGUF (softcaps and window from its metadata, the scale as llama.cpp takes
    it) serves what the HF model computes."""
    from radixflow.runtime.model_loader.gguf_convert import convert_gguf

    folder, model, tok = make_family_model(tmp_path / "hf", "gemma2", tie_word_embeddings=True,
                                           query_pre_attn_scalar=16)
    gguf_path = _write_gemma2_gguf(folder, model, tmp_path / "gemma2.gguf")
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(gguf_path, converted)
    # (the weights and config are what is tested: the tiny byte-level BPE is not a Gemma
    # tokenizer, which transformers' GGUF reader rebuilds as SentencePiece)
    tok.save_pretrained(converted)
    check_engine_matches(converted, model, tok, PROMPTS)


def test_gemma3_gguf_matches_hf(tmp_path):
    """A Gemma 3 GGUF as llama.cpp's converter writes it (every norm, q/k norms too, stored as
    1 + w; the window in the metadata; the local RoPE base 10000 and five local layers to a
    global one, llama.cpp's fixed values) serves what the HF model computes."""
    from radixflow.runtime.model_loader.gguf_convert import convert_gguf

    folder, model, tok = make_family_model(
        tmp_path / "hf", "gemma3", tie_word_embeddings=True, query_pre_attn_scalar=16,
        num_hidden_layers=6, sliding_window_pattern=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}})

    def extra(writer, c):
        writer.add_key_length(c.head_dim)
        writer.add_value_length(c.head_dim)
        writer.add_sliding_window(c.sliding_window)

    def tensor(name, t):
        if name == "lm_head.weight":
            return None
        return t + 1 if name.endswith("norm.weight") else t

    gguf_path = write_family_gguf(folder, model, tmp_path / "gemma3.gguf", "gemma3", extra,
                                  tensor)
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(gguf_path, converted)
    tok.save_pretrained(converted)  # (as for Gemma 2: the tiny BPE is not Gemma's tokenizer)
    check_engine_matches(converted, model, tok, PROMPTS)
