"""Mixture-of-experts families (moe.py) against transformers in fp32: Qwen3-MoE, Qwen2-MoE
(shared expert, dense layers by decoder_sparse_step), Mixtral (its checkpoint names) and OLMoE
(whole-projection q/k norms, clip_qkv): greedy output token-identical and prompt logprobs
within 1e-4 through radixflow.Engine, on one rank and split over two; the grouped experts
against a dense loop; what the other paths do with experts."""

from __future__ import annotations

import pytest
import torch
from helpers.family_models import (
    COMMON,
    FAMILIES,
    PROMPTS,
    check_engine_matches,
    make_family_model,
)

from radixflow.runtime.models.config import ModelArgs
from radixflow.runtime.models.llama import LlamaForCausalLM
from radixflow.runtime.models.moe import SparseMoe


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"])
def test_moe_family_matches_hf(tmp_path, family):
    folder, model, tok = make_family_model(tmp_path, family)
    check_engine_matches(folder, model, tok)


def _args(family: str, **overrides) -> ModelArgs:
    config_cls, extra = FAMILIES[family]
    arch = config_cls.replace("Config", "ForCausalLM")
    return ModelArgs.from_hf_config({**COMMON, "vocab_size": 300, "architectures": [arch],
                                     **extra, **overrides})


def test_moe_config_fields():
    qwen3 = _args("qwen3_moe")
    assert (qwen3.num_experts, qwen3.num_experts_per_tok, qwen3.moe_intermediate_size) == (4, 2, 32)
    assert qwen3.norm_topk_prob and qwen3.dense_layers == (1,) and qwen3.qk_norm
    qwen2 = _args("qwen2_moe")
    assert qwen2.dense_layers == (0,) and qwen2.shared_expert_intermediate_size == 48
    assert not qwen2.norm_topk_prob and qwen2.qkv_bias and not qwen2.o_proj_bias
    mixtral = _args("mixtral")
    assert mixtral.norm_topk_prob and mixtral.moe_intermediate_size == 128
    olmoe = _args("olmoe")
    assert not olmoe.qk_norm_per_head and olmoe.clip_qkv == 0.8
    for args in (qwen3, qwen2, mixtral):  # the C decode step computes their MoE layers
        assert args.fused_decode_gaps() == []
    assert olmoe.fused_decode_gaps() == ["q/k norms over the whole projection", "clip_qkv"]
    with pytest.raises(Exception, match="num_experts_per_tok 5 of 4"):
        _args("mixtral", num_experts_per_tok=5)


def test_grouped_experts_equal_a_dense_loop():
    torch.manual_seed(0)
    moe = SparseMoe(_args("qwen2_moe"))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(9, 64)
    weights, ids = moe.route(x)
    assert ids.shape == (9, 2) and torch.allclose(weights.sum(-1) <= 1.0 + 1e-6,
                                                  torch.ones(9, dtype=torch.bool))
    dense = torch.stack([sum(weights[t, j] * moe.experts[int(ids[t, j])](x[t])
                             for j in range(2)) for t in range(9)])
    dense = dense + torch.sigmoid(moe.shared_expert_gate(x)) * moe.shared_expert(x)
    torch.testing.assert_close(moe(x), dense, atol=1e-5, rtol=1e-5)


def test_only_routed_experts_run():
    moe = SparseMoe(_args("mixtral"))
    calls = []
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda mod, inp, out, e=e: calls.append((e, inp[0].shape[0])))
    x = torch.randn(1, 64)
    _, ids = moe.route(x)
    moe(x)
    assert sorted(e for e, _ in calls) == sorted(ids[0].tolist()) and all(n == 1 for _, n in calls)


def test_stacked_expert_checkpoints_load():
    """transformers >= 5's stacked layout (mlp.experts.gate_up_proj [E, 2I, H]) loads as the
    per-expert tensors it stacks."""
    args = _args("qwen3_moe")
    model = LlamaForCausalLM(args)
    state = {f"model.{k}": v.clone().normal_() for k, v in model.state_dict().items()}
    stacked = {}
    for name in list(state):
        if ".experts." in name:
            stem, rest = name.split(".experts.")
            e, proj = rest.split(".")[:2]
            stacked.setdefault(f"{stem}.experts.{proj}", {})[int(e)] = state.pop(name)
    for name, parts in stacked.items():
        state[name] = torch.stack([parts[e] for e in sorted(parts)])
    fresh = LlamaForCausalLM(args)
    fresh.load_weights(state.items())
    expert = fresh.layers[0].mlp.experts[3].gate_up_proj.weight
    torch.testing.assert_close(expert, state["model.layers.0.mlp.experts.gate_up_proj"][3])


def _write_qwen3moe_gguf(folder, model, dest, arch="qwen3moe"):
    """`model` as llama.cpp's qwen3moe (qwen2moe) GGUF: the experts as its stacked
    ffn_{gate,up,down}_exps."""
    from helpers.family_models import write_family_gguf

    experts = {}

    def extra(writer, config):
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        if arch == "qwen2moe":
            writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)

    def tensor(hf_name, t):
        if ".mlp.experts." in hf_name:
            experts[hf_name] = t
            return None
        if hf_name.endswith("shared_expert_gate.weight"):  # llama.cpp: {n_embd}
            return t.reshape(-1)
        return t

    def add_experts(writer):
        for name, t in experts.items():
            layer = name.split(".")[2]
            if name.endswith("gate_up_proj"):
                gate, up = t.chunk(2, dim=1)
                writer.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", gate.numpy().copy())
                writer.add_tensor(f"blk.{layer}.ffn_up_exps.weight", up.numpy().copy())
            else:
                writer.add_tensor(f"blk.{layer}.ffn_down_exps.weight", t.numpy().copy())

    return write_family_gguf(folder, model, dest, arch, extra=extra, tensor=tensor,
                             after=add_experts)


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_moe_gguf_gives_the_hf_folders_logits(tmp_path, family):
    """llama.cpp's qwen3moe (which always renormalises: norm_topk_prob) and qwen2moe (with
    its shared expert) files, converted, serve what the HF folder does."""
    from radixflow.runtime.model_loader.gguf_convert import convert_gguf

    # (llama.cpp's files have no dense layers)
    dense_off = {"mlp_only_layers": []} if family == "qwen3_moe" else {
        "decoder_sparse_step": 1, "norm_topk_prob": False}
    folder, model, tok = make_family_model(tmp_path / "hf", family, **dense_off)
    arch = family.replace("_", "")
    gguf_path = _write_qwen3moe_gguf(folder, model, tmp_path / f"tiny-{arch}.gguf", arch)
    converted = tmp_path / "converted"
    converted.mkdir()
    convert_gguf(gguf_path, converted)
    # (the digits prompt is left out: transformers rebuilds the tiny BPE tokenizer from a
    # qwen3moe GGUF with Qwen's digit-splitting pre-tokenizer, so its ids differ)
    check_engine_matches(converted, model, tok, PROMPTS[:2])


@pytest.mark.parametrize("family", ["mixtral", "olmoe"])
def test_llamacpp_moe_gguf_matches_hf(tmp_path, family):
    """llama.cpp's Mixtral (a `llama` file with expert_count, q/k rows permuted) and olmoe
    (whole-projection q/k norms, unpermuted) files with stacked experts, read by
    gguf_own_reader: the converted folder serves what the HF model computes. (llama.cpp's
    olmoe converter writes no clip_qkv, so the model has none.)"""
    from helpers.family_models import write_llamacpp_gguf

    from radixflow.runtime.model_loader.gguf_convert import convert_gguf

    overrides = {"clip_qkv": None} if family == "olmoe" else {}
    folder, model, tok = make_family_model(tmp_path / "hf", family, **overrides)
    gguf_path = write_llamacpp_gguf(folder, model, tmp_path / f"tiny-{family}.gguf", family)
    converted = tmp_path / "converted"
    converted.mkdir()
    assert convert_gguf(gguf_path, converted)["architecture"] == type(model).__name__
    check_engine_matches(converted, model, tok)


def test_int4_quantizes_experts_and_keeps_the_router_dense():
    from radixflow.runtime.models.quant_linear import Int4Linear, quantize_linears_

    model = LlamaForCausalLM(_args("qwen2_moe"))
    quantize_linears_(model, keep=(model.lm_head,))
    moe = model.layers[1].mlp
    assert all(isinstance(e.gate_up_proj, Int4Linear) for e in moe.experts)
    assert isinstance(moe.shared_expert.gate_up_proj, Int4Linear)  # (48 in: not a group size)
    assert type(moe.gate).__name__ == "Router" and type(moe.shared_expert_gate).__name__ == "Router"


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe"])
def test_moe_tp2_matches_hf(tmp_path, family):
    """Experts split over two ranks (2 each; Qwen2-MoE's shared expert split like an MLP;
    Mixtral's block_sparse_moe.experts.N.w1/w2/w3 checkpoint names; OLMoE's whole-projection
    q/k norms split with their heads, their mean square taken over the ranks)."""
    folder, model, tok = make_family_model(tmp_path, family)
    check_engine_matches(folder, model, tok, tp_size=2)


def test_olmoe_tp4_replicated_kv_matches_hf(tmp_path):
    """Four ranks, 2 KV heads: each k_norm part is on two ranks, which the mean over the
    ranks weighs alike."""
    folder, model, tok = make_family_model(tmp_path, "olmoe", num_experts=8)
    check_engine_matches(folder, model, tok, tp_size=4)


def test_tp_shards_whole_experts():
    from radixflow.runtime.distributed.sharding import ShardSpec

    args = _args("qwen2_moe")
    spec = ShardSpec.create(args, 2, 1)
    assert spec.experts == (2, 2) and spec.shared_intermediate == (24, 24)
    w = torch.arange(4 * 64 * 3, dtype=torch.float32).view(4, 64, 3)
    names = dict(spec.shard_weights([
        ("model.layers.1.mlp.experts.1.down_proj.weight", w[0]),
        ("model.layers.1.mlp.experts.3.gate_proj.weight", w[1]),
        ("model.layers.1.mlp.experts.gate_up_proj", w),
        ("model.layers.1.mlp.shared_expert.down_proj.weight", torch.zeros(64, 48)),
        ("model.layers.1.mlp.gate.weight", torch.zeros(4, 64))]))
    assert set(names) == {"model.layers.1.mlp.experts.1.gate_proj.weight",
                          "model.layers.1.mlp.experts.gate_up_proj",
                          "model.layers.1.mlp.shared_expert.down_proj.weight",
                          "model.layers.1.mlp.gate.weight"}
    assert torch.equal(names["model.layers.1.mlp.experts.1.gate_proj.weight"], w[1])
    assert torch.equal(names["model.layers.1.mlp.experts.gate_up_proj"], w[2:])
    assert names["model.layers.1.mlp.shared_expert.down_proj.weight"].shape == (64, 24)
    assert names["model.layers.1.mlp.gate.weight"].shape == (4, 64)  # the router whole


def test_tensor_parallel_refuses_what_it_cannot_split():
    from radixflow.runtime.distributed.split import check_split

    with pytest.raises(ValueError, match="its 4 experts"):
        check_split(_args("qwen3_moe", num_attention_heads=8, num_key_value_heads=8), 8)
    with pytest.raises(ValueError, match="its 4 attention heads"):
        check_split(_args("olmoe"), 8)
    check_split(_args("olmoe"), 2)  # whole-projection q/k norms split (test_moe_tp2_matches_hf)


def test_tp_shards_whole_projection_qk_norms():
    """OLMoE's q_norm / k_norm weights span every head: a rank holds its heads' part (its KV
    head's when KV heads are replicated); Qwen3's per-head norms stay whole."""
    from radixflow.runtime.distributed.sharding import ShardSpec

    olmoe = _args("olmoe")  # 4 heads, 2 KV heads of 16 dims
    q, k = torch.arange(64.0), torch.arange(32.0)
    for tp, rank, q_rows, k_rows in ((2, 1, (32, 64), (16, 32)), (4, 1, (16, 32), (0, 16))):
        spec = ShardSpec.create(olmoe, tp, rank)
        assert torch.equal(spec.shard("model.layers.0.self_attn.q_norm.weight", q),
                           q[slice(*q_rows)])
        assert torch.equal(spec.shard("model.layers.0.self_attn.k_norm.weight", k),
                           k[slice(*k_rows)])
    per_head = torch.ones(16)
    spec = ShardSpec.create(_args("qwen3_moe"), 2, 1)
    assert spec.shard("model.layers.0.self_attn.k_norm.weight", per_head) is per_head


def test_stacked_weights_feed_the_grouped_kernel():
    """What a GPU forward runs: the experts' weights stacked (each expert's Linear then a view
    of the stack) through kernels/moe.py, Triton (under the interpreter on a CPU) and torch."""
    from radixflow.kernels.moe import moe_experts

    torch.manual_seed(0)
    moe = SparseMoe(_args("qwen3_moe"))
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(5, 64)
    weights, ids = moe.route(x)
    expected = moe.grouped_experts(x, weights, ids)
    gate_up, down = moe.stacked_weights()
    assert gate_up.shape == (4, 64, 64) and down.shape == (4, 64, 32)
    assert moe.experts[2].gate_up_proj.weight.data_ptr() == gate_up[2].data_ptr()
    torch.testing.assert_close(moe.grouped_experts(x, weights, ids), expected)
    for backend in ("torch", "triton"):
        torch.testing.assert_close(moe_experts(x, gate_up, down, ids, weights, backend=backend),
                                   expected, atol=1e-4, rtol=1e-4)
