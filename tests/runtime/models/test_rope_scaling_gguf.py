"""RoPE scaling read back from a GGUF as llama.cpp's converter writes it (keys and tensors),
and a converted tiny Llama 3 GGUF computing what its HF folder does."""

from __future__ import annotations

import math

import gguf
import pytest
import torch
from helpers.tiny_models import LLAMA3_ROPE_SCALING, make_tiny_model, write_tiny_gguf

from radixflow.runtime.model_loader.gguf_convert import convert_gguf
from radixflow.runtime.model_loader.hf_folder import load_config, transformers_model
from radixflow.runtime.models.config import ModelArgs
from radixflow.runtime.models.rope import rope_frequencies, rope_inv_freq
from radixflow.runtime.models.rope_scaling import llama3_from_divisors, scaling_from_gguf


def llama_cpp_divisors(theta, dim, factor, low, high, original):
    """convert_hf_to_gguf.py's rope_freqs for a llama3 config, float32 as it stores them."""
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * theta ** (i / dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


@pytest.mark.parametrize("theta,dim,factor,low,high,original", [
    (500000.0, 128, 8.0, 1.0, 4.0, 8192),  # Llama 3.1 8B
    (500000.0, 64, 32.0, 1.0, 4.0, 8192),  # Llama 3.2 1B
    (500000.0, 16, 8.0, 1.0, 4.0, 64),  # the tiny test model: one dim in the band
    (10000.0, 128, 4.0, 2.0, 16.0, 2048),  # another band: fitted from its dims
])
def test_llama3_parameters_recovered_from_rope_freqs(theta, dim, factor, low, high, original):
    divisors = llama_cpp_divisors(theta, dim, factor, low, high, original)
    scaling = llama3_from_divisors(divisors, theta)
    want = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}
    got = rope_inv_freq(dim, theta, scaling)
    torch.testing.assert_close(got, rope_inv_freq(dim, theta, want), rtol=1e-6, atol=0)
    assert scaling["factor"] == pytest.approx(factor)


def test_rope_freqs_that_are_not_llama3_are_refused():
    with pytest.raises(ValueError, match="not a Llama 3 scaling"):
        llama3_from_divisors([1.0, 3.0, 1.5, 8.0], 10000.0)
    assert llama3_from_divisors([1.0] * 8, 10000.0) is None


def test_gguf_keys_to_hf_scaling():
    def meta(arch="qwen2", **keys):
        return {"general.architecture": arch,
                **{f"{arch}.rope.scaling.{k}": v for k, v in keys.items()}}

    assert scaling_from_gguf(meta(), {}, theta=1e6) is None
    assert scaling_from_gguf(meta(type="linear", factor=4.0), {}, theta=1e4) == {
        "rope_type": "linear", "factor": 4.0}
    yarn = scaling_from_gguf(meta(type="yarn", factor=4.0, original_context_length=32768,
                                  yarn_beta_fast=32.0, yarn_attn_factor=1.1), {}, theta=1e6)
    assert yarn == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                    "beta_fast": 32.0, "attention_factor": 1.1}
    with pytest.raises(ValueError, match="yarn_log_multiplier"):
        scaling_from_gguf(meta(type="yarn", factor=4.0, yarn_log_multiplier=0.1), {}, theta=1e4)
    with pytest.raises(ValueError, match="yarn_ext_factor"):
        scaling_from_gguf(meta(type="yarn", factor=4.0, yarn_ext_factor=0.5), {}, theta=1e4)
    with pytest.raises(ValueError, match="'mrope' is not supported"):
        scaling_from_gguf(meta(type="mrope"), {}, theta=1e4)
    tensors = {"rope_factors_long.weight": [1.0, 2.0], "rope_factors_short.weight": [1.0, 1.5]}
    phi3 = scaling_from_gguf(meta("phi3", attn_factor=1.19, original_context_length=4096),
                             tensors, theta=1e4)
    assert phi3 == {"rope_type": "longrope", "long_factor": [1.0, 2.0],
                    "short_factor": [1.0, 1.5], "original_max_position_embeddings": 4096,
                    "attention_factor": 1.19}


def _write_gguf(monkeypatch, hf_folder, dest, *, keys=(), tensors=()):
    """write_tiny_gguf, plus llama.cpp's rope keys / tensors added before the header."""
    write_header = gguf.GGUFWriter.write_header_to_file

    def with_rope(self, *args, **kwargs):
        for name, value in keys:
            self.add_key_value(name, value, gguf.GGUFValueType.get_type(value))
        for name, array in tensors:
            self.add_tensor(name, array)
        return write_header(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_header_to_file", with_rope)
    write_tiny_gguf(hf_folder, dest)
    monkeypatch.undo()
    return dest


def _same_logits(original, converted):
    ids = torch.tensor([[5, 40, 99, 7, 300, 12, 8, 77] * 10])  # past the original 64 positions
    logits = []
    for folder in (original, converted):
        model = transformers_model(folder, torch.float32)
        with torch.no_grad():
            logits.append(model.eval()(ids).logits)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


def test_llama3_gguf_keeps_its_scaling(tmp_path, monkeypatch):
    """#26: a Llama 3 GGUF came back as plain RoPE; its rope_freqs now give llama3 back."""
    original = make_tiny_model(tmp_path / "hf", "llama3_rope")
    s = LLAMA3_ROPE_SCALING
    divisors = llama_cpp_divisors(500000.0, 16, s["factor"], s["low_freq_factor"],
                                  s["high_freq_factor"], s["original_max_position_embeddings"])
    path = _write_gguf(monkeypatch, original, tmp_path / "l3.gguf",
                       tensors=[("rope_freqs.weight", divisors)])
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(path, converted)
    ours, want = (ModelArgs.from_hf_config(load_config(f)) for f in (converted, original))
    assert ours.rope_scaling["rope_type"] == "llama3"
    torch.testing.assert_close(
        rope_frequencies(16, ours.rope_theta, ours.rope_scaling, seq_len=512)[0],
        rope_frequencies(16, want.rope_theta, want.rope_scaling, seq_len=512)[0], rtol=1e-6, atol=0)
    _same_logits(original, converted)


def test_yarn_gguf_keeps_its_scaling(tmp_path, monkeypatch):
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 16.0}
    original = make_tiny_model(tmp_path / "hf", "llama", rope_scaling=dict(yarn))
    keys = [("llama.rope.scaling.type", "yarn"), ("llama.rope.scaling.factor", 4.0),
            ("llama.rope.scaling.original_context_length", 64),
            ("llama.rope.scaling.yarn_beta_fast", 16.0)]
    path = _write_gguf(monkeypatch, original, tmp_path / "yarn.gguf", keys=keys)
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(path, converted)
    args = ModelArgs.from_hf_config(load_config(converted))
    assert {k: args.rope_scaling.get(k) for k in yarn} == yarn
    assert args.max_position_embeddings == 512  # max(512, 64 * 4)
    _same_logits(original, converted)
