"""gguf_own_reader: which files it reads, the q/k rows and stacked experts put back as the
transformers model holds them, quantized experts dequantized as gguf does. (Each family's
converted folder against transformers: tests/runtime/models/test_families*.py.)"""

from __future__ import annotations

import torch
from helpers.family_models import (
    llamacpp_permute,
    make_family_model,
    write_family_gguf,
    write_llamacpp_gguf,
)

from radixflow.runtime.model_loader import gguf_own_reader
from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights, unpermute_rows


def test_unpermute_undoes_llamacpps_permutation():
    """The row order gguf_tensors applies to stored (quantized) q/k rows and to biases."""
    t = torch.arange(32 * 3, dtype=torch.float32).view(32, 3)
    for heads in (1, 2, 4):
        assert torch.equal(llamacpp_permute(t, heads)[unpermute_rows(32, heads)], t)
    bias = torch.arange(32.0)
    assert torch.equal(llamacpp_permute(bias, 2)[unpermute_rows(32, 2)], bias)


def test_mixtral_file_with_quantized_experts(tmp_path):
    """A llama file with expert_count is read here (a dense llama file is not); the Q8_0
    experts come back stacked as transformers' gate_up_proj / down_proj, equal to gguf's own
    dequantization; q/k rows as the HF model's."""
    import gguf

    folder, model, _ = make_family_model(tmp_path / "hf", "mixtral")
    path = write_llamacpp_gguf(folder, model, tmp_path / "mixtral.gguf", "mixtral",
                               experts_qtype=gguf.GGMLQuantizationType.Q8_0)
    assert gguf_own_reader.reads_itself(path)
    dense, dense_model, _ = make_family_model(tmp_path / "dense", "mistral", sliding_window=None)
    assert not gguf_own_reader.reads_itself(
        write_family_gguf(dense, dense_model, tmp_path / "llama.gguf", "llama"))

    config, tokenizer, skeleton, plan = gguf_own_reader.read_gguf(path)
    tensors = dict(GGUFWeights(path, plan).dequantized())
    assert type(config).__name__ == "MixtralConfig" and config.num_local_experts == 4
    assert config.num_experts_per_tok == 2 and config.sliding_window is None
    state = model.state_dict()
    q8 = gguf.GGMLQuantizationType.Q8_0

    def q8_round_trip(t):
        return torch.from_numpy(gguf.quants.dequantize(
            gguf.quants.quantize(t.numpy().copy(), q8), q8)).reshape(t.shape)

    for name in ("gate_up_proj", "down_proj"):
        full = f"model.layers.1.mlp.experts.{name}"
        if name == "gate_up_proj":
            gate, up = state[full].chunk(2, dim=1)
            expected = torch.cat([q8_round_trip(gate), q8_round_trip(up)], dim=1)
        else:
            expected = q8_round_trip(state[full])
        assert torch.equal(tensors[full], expected)
    for name in ("q_proj", "k_proj"):
        full = f"model.layers.0.self_attn.{name}.weight"
        assert torch.equal(tensors[full], state[full])
    assert tokenizer("The quick brown fox").input_ids == _hf_tokenizer(folder)(
        "The quick brown fox").input_ids


def _hf_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
