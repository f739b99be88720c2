"""A quantized GGUF loads from its blocks into the C kernels' tiles (runtime/models/
stored_linears.py): no weights in the prepared folder, each layer in its stored type's
format, and the same logits as the file's tensors dequantized and run dense."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import make_tiny_model, write_tiny_gguf

from radixflow.kernels import cpu as cpu_kernels
from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
from radixflow.runtime.model_loader import load_config, resolve_model
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C kernels here")


def _qtype_by_part(default, **by_part):
    """A write_tiny_gguf qtype_of: norms F32; a tensor whose name holds one of by_part's keys
    (in their order: "v_proj", "embed", ...) that type, every other tensor `default` (gguf's
    type names)."""
    def qtype_of(hf_name):
        import gguf

        if "norm" in hf_name:
            return None
        name = next((t for part, t in by_part.items() if part in hf_name), default)
        return gguf.GGMLQuantizationType[name]

    return qtype_of


# Q8_0 for v and the embedding, Q4_0 for the rest
_qtype = _qtype_by_part("Q4_0", v_proj="Q8_0", embed="Q8_0")


def _prefill_logits(folder, **args):
    runner = ModelRunner(ServerArgs(model=str(folder), max_total_tokens=256, **args), folder,
                         load_config(folder))
    ids = [1, 5, 9, 33, 70, 2, 11] * 6  # (over QUANT_MAX_ROWS: the bf16 copies' products)
    slots = runner.kv_pool.alloc(len(ids))
    runner.req_to_token_pool.req_to_token[0, :len(ids)] = slots.to(torch.int32)
    logits = runner.forward(ForwardMode.EXTEND, [BatchRequest(
        req_pool_idx=0, ids=ids, start_pos=0, logit_offsets=list(range(len(ids))))], slots)
    return runner, logits


def _load_model_scale_shaped(tmp_path, qtype_of, **model_args):
    """A tiny Llama with a 1B's proportions (hidden 256, head_dim 64: whole super-blocks, clear
    logits) written as a GGUF of qtype_of's types and prefilled in bf16: its prepared folder,
    runner and logits."""
    original = make_tiny_model(tmp_path / "hf", "llama", hidden_size=256, intermediate_size=512,
                               head_dim=64, std=0.05, **model_args)
    path = write_tiny_gguf(original, tmp_path / "q.gguf", qtype_of=qtype_of)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    return folder, *_prefill_logits(folder, dtype="bfloat16")


def _linear_params(hf_folder):
    """Weights a decode step multiplies by, counted from the checkpoint: every projection
    and the head (the embedding when they are tied)."""
    from safetensors import safe_open

    with safe_open(str(hf_folder / "model.safetensors"), "pt") as f:
        shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}  # noqa: SIM118
    head = shapes.get("lm_head.weight", shapes["model.embed_tokens.weight"])
    projections = [s for name, s in shapes.items() if name.endswith("proj.weight")]
    return head[0] * head[1] + sum(a * b for a, b in projections)


def test_quantized_gguf_loads_as_stored(tmp_path):
    original = make_tiny_model(tmp_path / "hf", "llama")
    path = write_tiny_gguf(original, tmp_path / "q.gguf", qtype_of=_qtype)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    assert (folder / "gguf.json").is_file() and not list(folder.glob("*.safetensors"))

    runner, ours = _prefill_logits(folder, dtype="bfloat16")
    formats = runner.cpu_info()["weights"]
    assert formats["gate_up_proj"]["format"] == "q4_0"
    assert formats["gate_up_proj"]["stored"] == "Q4_0"
    # a fused layer's parts of different types kept apart (StackedLinear), each as stored
    assert formats["qkv_proj"] == {"stored": "Q4_0+Q8_0", "format": "q4_0+q8_0",
                                   "kernel": f"radixflow C {cpu_kernels.active_level()}"}
    assert formats["embed_tokens"]["stored"] == "Q8_0"
    assert runner.cpu_info()["dense_weights"]["mode"] == "on"  # (a tiny model keeps copies)
    dense_runner, dense = _prefill_logits(folder, dtype="float32", quantization="none")
    linear_params = _linear_params(original)
    assert dense_runner.cpu_info()["decode_step_weight_bytes"] == 4 * linear_params
    # 4-bit tiles with q8_0 for v and the head, the bf16 copies not counted: 0.5-1.1 B/weight
    assert 0.5 < runner.cpu_info()["decode_step_weight_bytes"] / linear_params < 1.1
    # bf16 activations against float32: close (which fixes the top-1 wherever it is clear;
    # this model's random logits are near ties at most positions)
    assert (ours - dense).abs().max() < 0.05 * dense.abs().max()
    forced, _ = _prefill_logits(folder, dtype="bfloat16", quantization="int4")
    assert forced.cpu_info()["weights"]["qkv_proj"]["format"] == "q4_1"
    assert forced.cpu_info()["weights"]["gate_up_proj"]["format"] == "q4_0"


# Q5_0 for v and down, Q4_0 for the rest
_five_bit_qtype = _qtype_by_part("Q4_0", v_proj="Q5_0", down_proj="Q5_0")


def test_five_bit_groups_load_as_stored(tmp_path):
    """Q5_0 stays Q5_0 (5.5 bits a weight); a fused layer of Q4_0 and Q5_0 parts keeps each
    part's own."""
    original = make_tiny_model(tmp_path / "hf", "llama")
    path = write_tiny_gguf(original, tmp_path / "q.gguf", qtype_of=_five_bit_qtype)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    runner, ours = _prefill_logits(folder, dtype="bfloat16")
    formats = runner.cpu_info()["weights"]
    assert formats["down_proj"] == {"stored": "Q5_0", "format": "q5_0",
                                    "kernel": f"radixflow C {cpu_kernels.active_level()}"}
    assert formats["qkv_proj"] == {"stored": "Q4_0+Q5_0", "format": "q4_0+q5_0",
                                   "kernel": f"radixflow C {cpu_kernels.active_level()}"}
    assert formats["gate_up_proj"]["format"] == "q4_0"
    down = next(m for name, m in runner.model.named_modules() if name.endswith("0.mlp.down_proj"))
    assert down.tiled.nbytes * 32 == down.in_features * down.out_features * 22  # as Q5_0
    _, dense = _prefill_logits(folder, dtype="float32", quantization="none")
    assert (ours - dense).abs().max() < 0.05 * dense.abs().max()
    assert torch.equal(ours.argmax(-1), dense.argmax(-1))


# Q8_0 for v and the embedding, Q4_K for the rest
_k_quant_qtype = _qtype_by_part("Q4_K", v_proj="Q8_0", embed="Q8_0")


def test_q4_k_layers_load_as_stored(tmp_path):
    """Q4_K (a Q4_K_M file's most layers) stays Q4_K: 4.5 bits a weight in the tiles, the
    same logits as the file dequantized and run dense."""
    folder, runner, ours = _load_model_scale_shaped(tmp_path, _k_quant_qtype)
    formats = runner.cpu_info()["weights"]
    as_stored = "q4_1" if cpu_kernels.active_level() == "avx2" else "q4_k"  # (stored_linears)
    for role in ("gate_up_proj", "down_proj", "o_proj"):
        assert formats[role] == {"stored": "Q4_K", "format": as_stored,
                                 "kernel": f"radixflow C {cpu_kernels.active_level()}"}, role
    assert formats["qkv_proj"] == {"stored": "Q4_K+Q8_0", "format": f"{as_stored}+q8_0",
                                   "kernel": f"radixflow C {cpu_kernels.active_level()}"}
    layer = next(m for name, m in runner.model.named_modules() if name.endswith("gate_up_proj"))
    bits = 4.5 if as_stored == "q4_k" else 5
    assert layer.tiled.nbytes * 8 == layer.in_features * layer.out_features * bits
    _, dense = _prefill_logits(folder, dtype="float32", quantization="none")
    _, dense_bf16 = _prefill_logits(folder, dtype="bfloat16", quantization="none")
    # the file's weights in both: the tiles' products differ from dense bf16 ones by bf16 noise
    assert (ours - dense).abs().max() < 1.5 * (dense_bf16 - dense).abs().max()
    forced, _ = _prefill_logits(folder, dtype="bfloat16", quantization="int4")
    assert forced.cpu_info()["weights"]["gate_up_proj"]["format"] == as_stored  # 4-bit already
    assert forced.cpu_info()["weights"]["qkv_proj"]["format"] == "q4_1"


def test_q4_k_is_q4_1_at_avx2(tmp_path, cpu_level):
    """At avx2 Q4_K loads as q4_1 (faster batch products there), with the log's reason."""
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models import stored_linears

    fmt = stored_linears.nearest_format(GGMLType.Q4_K)
    assert fmt == ("q4_1" if cpu_level == "avx2" else "q4_k")
    assert ("avx2" in stored_linears.why(GGMLType.Q4_K, fmt)) == (cpu_level == "avx2")


# Q6_K for the head, attention and down (as a Q4_K_M's head, v and down), Q4_K for gate/up
_six_bit_k_qtype = _qtype_by_part("Q6_K", gate_proj="Q4_K", up_proj="Q4_K")


def _assert_runs_as_the_dense_file(folder, runner, ours):
    """The tiles' logits (`ours`, the torch forward) and the C decode step's over the same
    tiles (one token a step, then three requests side by side: x as int8 at avx512 from 3
    rows) against the file dequantized and run dense: within the error bf16 activations make,
    the same top-1 wherever it is clear (random weights make near-ties)."""
    from helpers.c_step import teacher_forced_batch

    _, dense = _prefill_logits(folder, dtype="float32", quantization="none")
    _, dense_bf16 = _prefill_logits(folder, dtype="bfloat16", quantization="none")
    bf16_error = (dense_bf16 - dense).abs().max()
    assert (ours - dense).abs().max() < 1.5 * bf16_error
    assert runner.cpu_decode is not None
    ids = [1, 5, 9, 33, 70, 2, 11] * 6
    top2 = dense.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > 4 * bf16_error
    assert clear.sum() > len(clear) // 2
    for seqs in ([ids], [ids, ids[3:], ids[5:]]):
        stepped = teacher_forced_batch(runner, seqs, first_row=1)
        assert (stepped[0] - dense).abs().max() < 2.5 * bf16_error
        assert torch.equal(stepped[0].argmax(-1)[clear], dense.argmax(-1)[clear])


def test_q6_k_layers_load_as_stored(tmp_path):
    """Q6_K stays Q6_K: 6.5625 bits a weight in the tiles, every d and int8 scale as the file
    has them (the head's values are what gguf dequantizes, bit for bit; a fused layer's parts
    side by side), the same logits as the file dequantized and run dense."""
    from radixflow.kernels import gguf_blocks as gb
    from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights

    folder, runner, ours = _load_model_scale_shaped(tmp_path, _six_bit_k_qtype)
    formats = runner.cpu_info()["weights"]
    kernel = f"radixflow C {cpu_kernels.active_level()}"
    assert formats["down_proj"] == {"stored": "Q6_K", "format": "q6_k", "kernel": kernel}
    assert formats["lm_head"] == {"stored": "Q6_K", "format": "q6_k", "kernel": kernel}
    assert formats["qkv_proj"] == {"stored": "Q6_K", "format": "q6_k", "kernel": kernel}
    head = runner.model.lm_head
    assert head.tiled.nbytes * 256 == head.in_features * head.out_features * 210
    weights = GGUFWeights.of_folder(folder)
    stored = weights.tensor("lm_head.weight" if "lm_head.weight" in weights.names()
                            else "model.embed_tokens.weight")
    want = gb.dequantize(stored.raw, gb.GGMLType.Q6_K, stored.shape)
    assert torch.equal(cpu_kernels.unpack(head.tiled).view(torch.int32), want.view(torch.int32))
    _assert_runs_as_the_dense_file(folder, runner, ours)


# As llama-quantize's Q5_K_M: Q6_K for the head and down, Q5_K for the rest but v (Q4_K: a
# fused q/k/v of Q5_K and Q4_K parts, each kept in its own format)
_q5_k_m_qtype = _qtype_by_part("Q5_K", down_proj="Q6_K", lm_head="Q6_K", embed_tokens="Q6_K",
                               v_proj="Q4_K")


def test_q5_k_layers_load_as_stored(tmp_path):
    """Q5_K stays Q5_K: 5.5 bits a weight in the tiles, each weight what gguf dequantizes, bit
    for bit (a fused layer's Q4_K part, kept apart, too), the same logits as the file
    dequantized and run dense, in the torch forward and the C decode step."""
    from radixflow.kernels import gguf_blocks as gb
    from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights

    folder, runner, ours = _load_model_scale_shaped(tmp_path, _q5_k_m_qtype,
                                                    tie_word_embeddings=False)
    formats = runner.cpu_info()["weights"]
    kernel = f"radixflow C {cpu_kernels.active_level()}"
    assert formats["gate_up_proj"] == {"stored": "Q5_K", "format": "q5_k", "kernel": kernel}
    v_format = "q4_1" if cpu_kernels.active_level() == "avx2" else "q4_k"  # (stored_linears)
    assert formats["qkv_proj"] == {"stored": "Q4_K+Q5_K", "format": f"{v_format}+q5_k",
                                   "kernel": kernel}
    assert formats["down_proj"]["format"] == "q6_k"
    modules = dict(runner.model.named_modules())
    gate_up, qkv = (next(m for name, m in modules.items() if name.endswith(f"0.{kind}.{part}"))
                    for kind, part in (("mlp", "gate_up_proj"), ("self_attn", "qkv_proj")))
    assert gate_up.tiled.nbytes * 256 == gate_up.in_features * gate_up.out_features * 176
    weights = GGUFWeights.of_folder(folder)
    want = torch.cat([gb.dequantize(s.raw, s.qtype, s.shape) for s in (
        weights.tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv")])
    assert [t.format for t in qkv.tiled_parts] == ["q5_k", v_format]
    q_k, v = (cpu_kernels.unpack(t) for t in qkv.tiled_parts)
    assert torch.equal(q_k.view(torch.int32), want[:len(q_k)].view(torch.int32))
    if v_format == "q4_k":
        assert torch.equal(v.view(torch.int32), want[len(q_k):].view(torch.int32))
    else:  # (q4_1 holds Q4_K's scales d * sc as fp16)
        want_v = want[len(q_k):]
        assert (v - want_v).abs().max() <= 2 ** -9 * want_v.abs().max()
    _assert_runs_as_the_dense_file(folder, runner, ours)


def test_q4_0_and_q5_0_only_where_every_part_is_theirs():
    """q4_0 and q5_0 have no low value per group: a fused layer with another part takes q4_1
    or q5_1, which hold their groups exactly (low -8 d, -16 d)."""
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models.stored_linears import layer_format, why

    assert layer_format({GGMLType.Q4_0}) == "q4_0"
    assert layer_format({GGMLType.Q4_0, GGMLType.Q4_1}) == "q4_1"
    assert layer_format({GGMLType.Q4_0, GGMLType.Q4_K}) == "q4_1"
    assert layer_format({GGMLType.Q4_0, GGMLType.Q6_K}) == "q6"
    assert why(GGMLType.Q4_0, "q4_0") == "as stored"
    assert "-8 d" in why(GGMLType.Q4_0, "q4_1")
    assert layer_format({GGMLType.Q5_0}) == "q5_0"
    assert layer_format({GGMLType.Q5_1}) == "q5_1"
    assert layer_format({GGMLType.Q5_0, GGMLType.Q4_0}) == "q5_1"
    assert layer_format({GGMLType.Q5_0, GGMLType.Q4_K}) == "q5_1"
    assert layer_format({GGMLType.Q5_0, GGMLType.Q6_K}) == "q6"
    assert "-16 d" in why(GGMLType.Q5_0, "q5_1") and "exactly" in why(GGMLType.Q5_0, "q6")


def test_q5_k_takes_q4_k_parts_but_no_others():
    """q5_k holds a fused layer's Q4_K part as it is (the same fields, fifth bits zero); any
    other part makes the layer q6 (or wider)."""
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models.stored_linears import layer_format, nearest_format, why

    assert nearest_format(GGMLType.Q5_K) == "q5_k"
    assert layer_format({GGMLType.Q5_K}) == "q5_k"
    assert layer_format({GGMLType.Q5_K, GGMLType.Q4_K}) == "q5_k"
    assert layer_format({GGMLType.Q5_K, GGMLType.Q6_K}) == "q6"
    assert layer_format({GGMLType.Q5_K, GGMLType.Q4_0}) == "q6"
    assert layer_format({GGMLType.Q5_K, GGMLType.Q8_0}) == "q8_0"
    assert why(GGMLType.Q5_K, "q5_k") == "as stored"
    assert "exactly" in why(GGMLType.Q4_K, "q5_k")


def test_requantizing_to_6bit_rounds_on_the_kernels_grid():
    """A fused layer's affine 4-bit part (Q4_K q/k beside a Q6_K v) becomes 6-bit groups of
    16: each weight within half a step of the fp16 scale, and 6-bit values kept exactly."""
    from radixflow.runtime.models.stored_linears import quantize_6bit

    w = torch.randn(48, 64, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_6bit(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 31 and scale.shape == (48, 4)
    assert torch.equal(scale, scale.half().float())
    step = scale.repeat_interleave(16, 1)
    assert ((q.float() * step - w).abs() <= step / 2 * (1 + 1e-3)).all()
    again, same = quantize_6bit(q.float() * step)
    assert torch.equal(again, q) and torch.equal(same, scale)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k",
                                 "q6", "q6_k", "q8_0", "iq4_nl", "iq4_xs", "bf16"])
def test_tiling_a_chunk_at_a_time_makes_the_same_tiles(monkeypatch, fmt):
    """Big tensors tile CHUNK_ROWS rows at a time into one buffer (a 128k-row head never
    exists whole as int8 values): the same bytes as tiling the parts at once, for parts that
    end on a tile's edge and a last one that does not."""
    import gguf
    import numpy as np
    from helpers.gguf_test_blocks import (
        quantize_iq4,
        quantize_q2_k,
        quantize_q3_k,
        quantize_q4_k,
        quantize_q6_k,
    )

    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.model_loader.gguf_tensors import StoredTensor
    from radixflow.runtime.models import stored_linears

    k = 256 if fmt in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs") else 64

    def stored(rows, seed):
        w = np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32)
        if fmt == "q4_k":
            return StoredTensor(GGMLType.Q4_K, rows, k, torch.from_numpy(quantize_q4_k(w)))
        if fmt == "q5_k":
            return StoredTensor(GGMLType.Q5_K, rows, k, torch.from_numpy(quantize_q4_k(w, 5)))
        if fmt == "q6_k":
            return StoredTensor(GGMLType.Q6_K, rows, k, torch.from_numpy(quantize_q6_k(w)))
        if fmt == "q3_k":
            return StoredTensor(GGMLType.Q3_K, rows, k, torch.from_numpy(quantize_q3_k(w)))
        if fmt == "q2_k":
            return StoredTensor(GGMLType.Q2_K, rows, k, torch.from_numpy(quantize_q2_k(w)))
        if fmt in ("iq4_nl", "iq4_xs"):
            raw = quantize_iq4(w, xs=fmt == "iq4_xs")
            return StoredTensor(GGMLType[fmt.upper()], rows, k, torch.from_numpy(raw))
        kind = {"q5_0": "Q5_0", "q5_1": "Q5_1"}.get(fmt, "Q4_0")
        raw = gguf.quantize(w, gguf.GGMLQuantizationType[kind])
        return StoredTensor(GGMLType[kind], rows, k, torch.from_numpy(raw.copy()))

    parts = [stored(96, 0), stored(64, 1), stored(40, 2)]  # whole tiles, then 2.5 tiles
    whole = stored_linears._tile_chunk(parts, fmt)
    monkeypatch.setattr(stored_linears, "CHUNK_ROWS", 32)
    chunked = stored_linears._tile(parts, fmt)
    assert (chunked.format, chunked.n, chunked.k) == (fmt, 200, k)
    assert torch.equal(chunked.data, whole.data)
    uneven = stored_linears._tile([stored(40, 2), stored(16, 0)], fmt)  # shares a tile
    assert torch.equal(cpu_kernels.unpack(uneven)[:40], cpu_kernels.unpack(whole)[160:])


# IQ4_XS for q, k, gate and up, IQ4_NL for v, o and down (a fused q/k/v of both, each part kept in
# its own format), Q8_0 for the embedding.
_iq4_qtype = _qtype_by_part(
    "IQ4_XS", embed="Q8_0", v_proj="IQ4_NL", o_proj="IQ4_NL", down_proj="IQ4_NL")


def test_iq4_layers_load_as_stored(tmp_path):
    """IQ4_NL and IQ4_XS stay as stored (4.5 and 4.31 bits a weight: the file's 4.25 plus an
    int8 per group for the six-bit scale), each weight what gguf dequantizes (a fused layer of
    both keeps each part's own); the same logits as the file dequantized and run dense, in the
    torch forward and the C decode step."""
    from radixflow.kernels import gguf_blocks as gb
    from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights

    folder, runner, ours = _load_model_scale_shaped(tmp_path, _iq4_qtype)
    formats = runner.cpu_info()["weights"]
    kernel = f"radixflow C {cpu_kernels.active_level()}"
    assert formats["gate_up_proj"] == {"stored": "IQ4_XS", "format": "iq4_xs", "kernel": kernel}
    assert formats["down_proj"] == {"stored": "IQ4_NL", "format": "iq4_nl", "kernel": kernel}
    assert formats["qkv_proj"] == {"stored": "IQ4_NL+IQ4_XS", "format": "iq4_nl+iq4_xs",
                                   "kernel": kernel}
    modules = dict(runner.model.named_modules())
    down, gate_up, qkv = (next(m for name, m in modules.items() if name.endswith(f"0.{part}"))
                          for part in ("mlp.down_proj", "mlp.gate_up_proj", "self_attn.qkv_proj"))
    assert down.tiled.nbytes * 32 == down.in_features * down.out_features * 18  # as IQ4_NL
    assert gate_up.tiled.nbytes * 256 == gate_up.in_features * gate_up.out_features * 138
    weights = GGUFWeights.of_folder(folder)
    for module, names in ((down, ["mlp.down_proj"]), (gate_up, ["mlp.gate_proj", "mlp.up_proj"]),
                          (qkv, [f"self_attn.{p}_proj" for p in "qkv"])):
        want = torch.cat([gb.dequantize(s.raw, s.qtype, s.shape) for s in (
            weights.tensor(f"model.layers.0.{name}.weight") for name in names)])
        parts = module.tiled_parts if module is qkv else (module.tiled,)
        got = torch.cat([cpu_kernels.unpack(t) for t in parts])
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    _assert_runs_as_the_dense_file(folder, runner, ours)


def test_iq4_as_stored_only_where_every_part_is_that_type():
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models.stored_linears import layer_format, nearest_format, why

    for kind, fmt in ((GGMLType.IQ4_NL, "iq4_nl"), (GGMLType.IQ4_XS, "iq4_xs")):
        assert nearest_format(kind) == layer_format({kind}) == fmt
        assert why(kind, fmt) == "as stored" and "exactly" in why(kind, "q8_0")
        assert layer_format({kind, GGMLType.Q4_K}) == "q8_0"
        assert layer_format({kind, GGMLType.Q6_K}) == "q8_0"
        assert layer_format({kind, GGMLType.F16}) == "bf16"
    assert layer_format({GGMLType.IQ4_NL, GGMLType.IQ4_XS}) == "q8_0"


@pytest.mark.parametrize("name", ["IQ4_NL", "IQ4_XS"])
def test_iq4_layers_fit_q8_0_exactly(name):
    """IQ4's 4-bit codes index int8 values: q8_0 (a fused layer beside another type) holds them
    and their scales as they are."""
    from helpers.gguf_test_blocks import covering_blocks

    from radixflow.kernels.gguf_blocks import QUANT_SIZES, GGMLType, dequantize
    from radixflow.runtime.model_loader.gguf_tensors import StoredTensor
    from radixflow.runtime.models import stored_linears

    kind = GGMLType[name]
    block, size = QUANT_SIZES[kind]
    raw = torch.from_numpy(covering_blocks(name, n=512)).reshape(32, -1)  # 32 rows
    stored = StoredTensor(kind, 32, raw.shape[1] // size * block, raw)
    tiled = stored_linears._tile([stored], "q8_0")
    expected = dequantize(raw, kind, stored.shape)
    assert torch.equal(cpu_kernels.unpack(tiled).view(torch.int32), expected.view(torch.int32))


def test_q6_k_needs_every_part_q6_k():
    """A fused layer takes q6_k only where all its parts are Q6_K: q6_k's int8 scales under one
    d per 256 cannot hold a Q4_K part's groups, q6's fp16 scale per 16 can."""
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models.stored_linears import layer_format, why

    assert layer_format({GGMLType.Q6_K}) == "q6_k"
    assert layer_format({GGMLType.Q4_K, GGMLType.Q6_K}) == "q6"
    assert layer_format({GGMLType.Q6_K, GGMLType.Q8_0}) == "q8_0"
    assert "fp16" in why(GGMLType.Q6_K, "q6") and why(GGMLType.Q6_K, "q6_k") == "as stored"


def test_a_fused_layers_parts_stand_apart_in_runs_that_end_on_a_tile():
    """A fused layer's parts of different formats are kept apart in runs of one format (the C
    step reads them as one chain), only where every run but the last ends on a tile's edge and
    there are at most MAX_PARTS runs; else the layer takes one format wide enough for all."""
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.models.stored_linears import _groups_apart, nearest_format

    class Stored:  # (what _groups_apart asks of GGUFWeights)
        def __init__(self, **parts):
            self.parts = parts

        def stored_type(self, name):
            return self.parts[name][0]

        def hf_shape(self, name):
            return (self.parts[name][1], 64)

    q4k, q6k = GGMLType.Q4_K, GGMLType.Q6_K
    mixed = Stored(q=(q4k, 64), k=(q4k, 32), v=(q6k, 32))
    assert _groups_apart(mixed, ["q", "k", "v"]) == [(["q", "k"], nearest_format(q4k)),
                                                     (["v"], "q6_k")]
    assert _groups_apart(Stored(q=(q4k, 40), k=(q6k, 32)), ["q", "k"]) == []  # off a tile
    assert _groups_apart(Stored(q=(q4k, 32), k=(q6k, 40)), ["q", "k"]) != []  # (the last may)
    assert _groups_apart(Stored(q=(q4k, 32), k=(q4k, 32)), ["q", "k"]) == []  # one format
    four = Stored(a=(q4k, 16), b=(q6k, 16), c=(q4k, 16), d=(q6k, 16))
    assert _groups_apart(four, ["a", "b", "c", "d"]) == []


# As llama-quantize's Q3_K_M: Q3_K for q, k, gate and up, Q4_K for v, o and down, Q6_K for the
# embedding (the head, tied).
_q3_k_m_qtype = _qtype_by_part(
    "Q3_K", embed="Q6_K", v_proj="Q4_K", o_proj="Q4_K", down_proj="Q4_K")


def test_q3_k_layers_load_as_stored(tmp_path):
    """Q3_K stays Q3_K: 3.5625 bits a weight (the file's 3.4375 plus an int8 where it packs six
    bits per scale), each weight what gguf dequantizes (a fused layer's Q3_K q/k beside its
    Q4_K v, each in its own format); the same logits as the file dequantized and run dense, in
    the torch forward and the C decode step."""
    from radixflow.kernels import gguf_blocks as gb
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights
    from radixflow.runtime.models.stored_linears import layer_format, nearest_format, why

    assert nearest_format(GGMLType.Q3_K) == layer_format({GGMLType.Q3_K}) == "q3_k"
    assert why(GGMLType.Q3_K, "q3_k") == "as stored" and "fp16" in why(GGMLType.Q3_K, "q6")
    assert layer_format({GGMLType.Q3_K, GGMLType.Q4_K}) == "q6"  # (where they cannot stand apart)
    assert layer_format({GGMLType.Q3_K, GGMLType.Q8_0}) == "q8_0"
    folder, runner, ours = _load_model_scale_shaped(tmp_path, _q3_k_m_qtype)
    formats = runner.cpu_info()["weights"]
    kernel = f"radixflow C {cpu_kernels.active_level()}"
    as_stored = "q4_1" if cpu_kernels.active_level() == "avx2" else "q4_k"  # (stored_linears)
    assert formats["gate_up_proj"] == {"stored": "Q3_K", "format": "q3_k", "kernel": kernel}
    assert formats["qkv_proj"] == {"stored": "Q3_K+Q4_K", "format": f"q3_k+{as_stored}",
                                   "kernel": kernel}
    modules = dict(runner.model.named_modules())
    gate_up, qkv = (next(m for name, m in modules.items() if name.endswith(f"0.{part}"))
                    for part in ("mlp.gate_up_proj", "self_attn.qkv_proj"))
    assert gate_up.tiled.nbytes * 256 == gate_up.in_features * gate_up.out_features * 114
    weights = GGUFWeights.of_folder(folder)
    want = torch.cat([gb.dequantize(s.raw, s.qtype, s.shape) for s in (
        weights.tensor(f"model.layers.0.mlp.{p}_proj.weight") for p in ("gate", "up"))])
    got = cpu_kernels.unpack(gate_up.tiled)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    q_k = cpu_kernels.unpack(qkv.tiled_parts[0])
    want = torch.cat([gb.dequantize(s.raw, s.qtype, s.shape) for s in (
        weights.tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qk")])
    assert torch.equal(q_k.view(torch.int32), want.view(torch.int32))
    _assert_runs_as_the_dense_file(folder, runner, ours)


# As llama-quantize's Q2_K: Q2_K for q, k, gate and up, Q3_K for v and down, Q4_K for o, Q6_K for
# the embedding (the head, tied).
_q2_k_qtype = _qtype_by_part(
    "Q2_K", embed="Q6_K", v_proj="Q3_K", down_proj="Q3_K", o_proj="Q4_K")


def test_q2_k_layers_load_as_stored(tmp_path):
    """Q2_K stays Q2_K: 2.625 bits a weight, as the file, each weight what gguf dequantizes
    (a fused q/k/v keeps its Q2_K q/k as q2_k beside its Q3_K v); the same logits as the file
    dequantized and run dense, in the torch forward and the C decode step."""
    from radixflow.kernels import gguf_blocks as gb
    from radixflow.kernels.gguf_blocks import GGMLType
    from radixflow.runtime.model_loader.gguf_tensors import GGUFWeights
    from radixflow.runtime.models.stored_linears import layer_format, nearest_format, why

    assert nearest_format(GGMLType.Q2_K) == layer_format({GGMLType.Q2_K}) == "q2_k"
    assert why(GGMLType.Q2_K, "q2_k") == "as stored"
    assert layer_format({GGMLType.Q2_K, GGMLType.Q3_K}) == "q8_0"  # (where they cannot stand apart)
    assert "requantized" in why(GGMLType.Q2_K, "q8_0")
    folder, runner, ours = _load_model_scale_shaped(tmp_path, _q2_k_qtype)
    formats = runner.cpu_info()["weights"]
    kernel = f"radixflow C {cpu_kernels.active_level()}"
    assert formats["gate_up_proj"] == {"stored": "Q2_K", "format": "q2_k", "kernel": kernel}
    assert formats["qkv_proj"] == {"stored": "Q2_K+Q3_K", "format": "q2_k+q3_k", "kernel": kernel}
    modules = dict(runner.model.named_modules())
    gate_up = next(m for name, m in modules.items() if name.endswith("0.mlp.gate_up_proj"))
    assert gate_up.tiled.nbytes * 256 == gate_up.in_features * gate_up.out_features * 84
    weights = GGUFWeights.of_folder(folder)
    want = torch.cat([gb.dequantize(s.raw, s.qtype, s.shape) for s in (
        weights.tensor(f"model.layers.0.mlp.{p}_proj.weight") for p in ("gate", "up"))])
    got = cpu_kernels.unpack(gate_up.tiled)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    _assert_runs_as_the_dense_file(folder, runner, ours)


# q Q4_0, k Q8_0, v Q5_0: a fused q/k/v of three formats; the rest Q4_0.
_three_formats_qtype = _qtype_by_part("Q4_0", k_proj="Q8_0", embed="Q8_0", v_proj="Q5_0")


def test_a_fused_layer_of_three_formats_runs_as_one_chain(tmp_path):
    """q, k and v each in its own format (MAX_PARTS of them): the C decode step reads the three
    as one chain of weights, each with x split for its format, and matches the dense file."""
    folder, runner, ours = _load_model_scale_shaped(tmp_path, _three_formats_qtype)
    qkv = next(m for name, m in runner.model.named_modules()
               if name.endswith("0.self_attn.qkv_proj"))
    assert [t.format for t in qkv.tiled_parts] == ["q4_0", "q8_0", "q5_0"]
    assert runner.cpu_info()["weights"]["qkv_proj"]["format"] == "q4_0+q5_0+q8_0"
    _assert_runs_as_the_dense_file(folder, runner, ours)
