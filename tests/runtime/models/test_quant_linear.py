from __future__ import annotations

import pytest
import torch
from torch import nn

from radixflow.kernels import cpu as cpu_kernels
from radixflow.runtime.models.quant_linear import (
    QUANT_MAX_ROWS,
    Int4Linear,
    Q8_0Linear,
    TiledBF16Linear,
    can_quantize_int4,
    is_exact,
    quantize_groups,
    quantize_linears_,
)

pytestmark = pytest.mark.skipif(not can_quantize_int4(torch.device("cpu")),
                                reason="torch has no int4 CPU kernel")


def test_quantize_groups_round_trip_on_grid_values():
    torch.manual_seed(0)
    # values already on a 16-level grid per group (as Q4_1 weights are) come back exactly
    q = torch.randint(0, 16, (8, 64))
    q[:, ::32] = 0
    q[:, 1::32] = 15
    scale = torch.rand(8, 2) * 0.1 + 0.01
    low = torch.randn(8, 2)
    w = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
    q2, s2, l2 = quantize_groups(w)
    torch.testing.assert_close(l2 + 0, low)
    torch.testing.assert_close(s2, scale)
    assert torch.equal(q2, q.to(torch.int32))


@pytest.mark.parametrize("rows", [1, QUANT_MAX_ROWS])
@pytest.mark.parametrize("bias", [False, True])
def test_int4_linear_matches_dequantized_weights(rows, bias):
    torch.manual_seed(1)
    linear = nn.Linear(64, 48, bias=bias)
    quant = Int4Linear(linear)
    q, scale, low = quantize_groups(linear.weight.detach())
    dequant = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    ref = x.float() @ dequant.T + (linear.bias.detach() if bias else 0)
    torch.testing.assert_close(quant(x).float(), ref, atol=5e-2, rtol=3e-2)
    # and the quantization error itself is small
    assert (dequant - linear.weight).abs().max() <= scale.max() / 2 + 1e-6


@pytest.mark.parametrize("rows", [QUANT_MAX_ROWS + 1, 33])
def test_int4_linear_uses_its_bf16_weights_for_many_rows(rows):
    torch.manual_seed(5)
    linear = nn.Linear(64, 48, bias=True)
    quant = Int4Linear(linear)
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    ref = nn.functional.linear(x, linear.weight.bfloat16(), linear.bias.bfloat16())
    torch.testing.assert_close(quant(x), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("rows", [1, QUANT_MAX_ROWS + 1, 33])
def test_an_fp32_model_keeps_no_dense_copy_and_quantizes_every_row_count(rows):
    torch.manual_seed(5)
    linear = _grid_linear(48, 64)
    quant = Int4Linear(linear, dtype=torch.float32)
    assert quant.dense is None
    x = torch.randn(rows, 64)
    out = quant(x)
    assert out.dtype == torch.float32
    # within the kernels' rounding of x (8-bit groups at avx2) of the exact product
    ref = x @ linear.weight.T
    scale = float(x.abs().max() * linear.weight.abs().sum(1).max())
    torch.testing.assert_close(out, ref, atol=scale / 100, rtol=0)


def _grid_linear(out_features: int, in_features: int) -> nn.Linear:
    """A linear whose weights are 4-bit groups already, as a Q4_1 GGUF's dequantized ones are."""
    groups = in_features // 32
    q = torch.randint(0, 16, (out_features, in_features)).float()
    q[:, ::32], q[:, 1::32] = 0, 15
    scale = torch.rand(out_features, groups) * 0.05 + 0.01
    low = -torch.rand(out_features, groups)
    linear = nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
    return linear


def test_is_exact_tells_4bit_weights_from_others():
    torch.manual_seed(2)
    grid = _grid_linear(16, 64).weight.detach()
    assert is_exact(grid, quantize_groups(grid))
    dense = torch.randn(16, 64)
    assert not is_exact(dense, quantize_groups(dense))


def _model(grid: bool) -> nn.Module:
    make = _grid_linear if grid else (lambda o, i: nn.Linear(i, o, bias=False))
    model = nn.Module()
    model.body = nn.Sequential(make(64, 64), make(32, 64))
    model.lm_head = nn.Linear(32, 100, bias=False)  # never 4-bit here
    return model


def _assert_head_kept_in_bf16(model: nn.Module, weight: torch.Tensor) -> None:
    """Not 4-bit: with the CPU kernels a tiled bf16 copy (TiledBF16Linear), else untouched."""
    if cpu_kernels.available():
        assert isinstance(model.lm_head, TiledBF16Linear)
        torch.testing.assert_close(cpu_kernels.unpack(model.lm_head.tiled),
                                   weight.bfloat16().float(), atol=0, rtol=0)
        for rows in (1, QUANT_MAX_ROWS + 1):
            x = torch.randn(rows, weight.shape[1], dtype=torch.bfloat16)
            torch.testing.assert_close(model.lm_head(x).float(), x.float() @ weight.T,
                                       atol=3e-2, rtol=2e-2)
    else:
        assert type(model.lm_head) is nn.Linear


def test_only_if_exact_quantizes_lossless_checkpoints_and_keeps_a_lossy_head():
    torch.manual_seed(3)
    model = _model(grid=True)
    head = model.lm_head.weight.detach().clone()
    kept = 1 if cpu_kernels.available() else 0
    assert quantize_linears_(model, keep=(model.lm_head,), only_if_exact=True) == 2 + kept
    assert all(isinstance(m, Int4Linear) for m in model.body)
    _assert_head_kept_in_bf16(model, head)

    dense = _model(grid=False)
    assert quantize_linears_(dense, keep=(dense.lm_head,), only_if_exact=True) == 0
    assert not any(isinstance(m, Int4Linear) for m in dense.modules())


def test_explicit_int4_quantizes_dense_weights_and_the_head_to_8_bits():
    """Lossy int4 asked for: the body 4-bit, the head 8-bit groups (half bf16's bytes), not
    4-bit; without the CPU kernels the head stays as it is."""
    torch.manual_seed(4)
    model = _model(grid=False)
    head = model.lm_head.weight.detach().clone()
    kept = 1 if cpu_kernels.available() else 0
    assert quantize_linears_(model, keep=(model.lm_head,)) == 2 + kept
    if not cpu_kernels.available():
        assert type(model.lm_head) is nn.Linear
        return
    assert isinstance(model.lm_head, Q8_0Linear)
    held = cpu_kernels.unpack(model.lm_head.tiled)
    groups = head.abs().view(head.shape[0], -1, 32).amax(-1).repeat_interleave(32, 1)
    assert ((held - head).abs() <= groups / 254 * 1.001).all()  # half a step of 8 bits
    x = torch.randn(3, head.shape[1], dtype=torch.bfloat16)
    torch.testing.assert_close(model.lm_head(x).float(), x.float() @ head.T, atol=5e-2,
                               rtol=3e-2)


def _q8_linear(out_features: int, in_features: int) -> nn.Linear:
    """A linear whose weights are symmetric 8-bit groups, as a Q8_0 GGUF tensor's are."""
    q = torch.randint(-127, 128, (out_features, in_features)).float()
    q[:, ::32] = 127
    scale = torch.rand(out_features, in_features // 32) * 0.01 + 0.001
    linear = nn.Linear(in_features, out_features, bias=False)
    linear.weight.data = q * scale.repeat_interleave(32, 1)
    return linear


@pytest.mark.skipif(not cpu_kernels.available(),
                    reason="radixflow's CPU kernels do not run at this level (generic)")
def test_an_8bit_head_becomes_q8_0_and_matches_its_weights():
    torch.manual_seed(6)
    model = _model(grid=True)
    model.lm_head = _q8_linear(100, 32)
    weight = model.lm_head.weight.detach().clone()
    assert quantize_linears_(model, keep=(model.lm_head,), only_if_exact=True) == 3
    assert isinstance(model.lm_head, Q8_0Linear)
    for rows in (1, Q8_0Linear.max_rows, Q8_0Linear.max_rows + 1, QUANT_MAX_ROWS + 3):
        x = torch.randn(rows, 32, dtype=torch.bfloat16)
        ref = x.float() @ weight.T
        torch.testing.assert_close(model.lm_head(x).float(), ref, atol=3e-2, rtol=2e-2)


# ---- --cpu-dense-weights: bf16 copies, or blocks dequantized from the tiles ----

def _many_row_layers() -> list[tuple[type, nn.Linear, dict]]:
    """A layer of each tiled kind with its weights: the products above max_rows rows."""
    torch.manual_seed(7)
    grid = _grid_linear(200, 96)  # n = 200: no whole block of rows, nor of tiles
    grid.bias = nn.Parameter(torch.randn(200) * 0.1)
    return [(Int4Linear, grid, {}), (Q8_0Linear, _q8_linear(72, 160), {}),
            (TiledBF16Linear, nn.Linear(96, 50, bias=False), {})]


@pytest.mark.skipif(not cpu_kernels.available(),
                    reason="radixflow's CPU kernels do not run at this level (generic)")
@pytest.mark.parametrize("rows", [9, 64, 300])
def test_without_a_copy_many_rows_multiply_blocks_of_the_tiles(rows):
    for kind, linear, extra in _many_row_layers():
        with_copy = kind(linear, dtype=torch.bfloat16, **extra)
        without = kind(linear, dtype=torch.bfloat16, dense_copy=False, **extra)
        assert with_copy.dense is not None and without.dense is None
        assert not any(p.dtype == torch.bfloat16 for p in without.parameters())
        x = torch.randn(rows, linear.in_features, dtype=torch.bfloat16)
        out = without(x)
        weights = cpu_kernels.unpack(without.tiled).bfloat16().float()
        bias = 0 if linear.bias is None else linear.bias.detach().bfloat16().float()
        ref = x.float() @ weights.T + bias
        scale = float((x.float().abs() @ weights.abs().T).max())
        int8_x = 0.0  # x as int8 at avx2, and at avx512 from 3 rows (test_cpu_gemv.py)
        if cpu_kernels.active_level() == "avx2" or rows >= cpu_kernels.batch_int8_rows() > 0:
            group_max = x.float().abs().view(rows, -1, 32).amax(-1).repeat_interleave(32, 1)
            int8_x = float((group_max / 254 @ weights.abs().T).max())
        torch.testing.assert_close(out.float(), ref, atol=1e-3 * scale + 1e-2 + int8_x,
                                   rtol=1e-2)
        torch.testing.assert_close(out.float(), with_copy(x).float(),
                                   atol=1e-3 * scale + 2e-2 + int8_x, rtol=2e-2)


def test_dense_weights_policy(monkeypatch):
    from radixflow.runtime.models import quant_linear

    assert quant_linear.keep_dense_copies("on", 1 << 40)
    assert not quant_linear.keep_dense_copies("off", 0)
    assert quant_linear.keep_dense_copies("auto", quant_linear.DENSE_AUTO_LIMIT)
    monkeypatch.setattr(cpu_kernels, "available", lambda: True)
    assert not quant_linear.keep_dense_copies("auto", quant_linear.DENSE_AUTO_LIMIT + 1)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)  # no blocks to dequantize
    assert quant_linear.keep_dense_copies("auto", quant_linear.DENSE_AUTO_LIMIT + 1)
    with pytest.raises(ValueError, match="--cpu-dense-weights must be one of"):
        quant_linear.keep_dense_copies("sometimes", 0)


@pytest.mark.skipif(not cpu_kernels.available(),
                    reason="radixflow's CPU kernels do not run at this level (generic)")
@pytest.mark.parametrize("choice", ["on", "off", "auto"])
def test_quantize_linears_keeps_copies_as_asked_and_says_so(choice, monkeypatch, caplog):
    """auto with copies over its limit (lowered here) keeps none."""
    from radixflow.runtime.models import quant_linear

    monkeypatch.setattr(quant_linear, "DENSE_AUTO_LIMIT", 1000)
    model = _model(grid=True)
    layers = [(64, 64), (32, 64), (100, 32)]  # out, in: the body's two, then the head
    copies = sum(o * i * 2 for o, i in layers)
    with caplog.at_level("INFO", logger=quant_linear.__name__):
        assert quantize_linears_(model, keep=(model.lm_head,), dense_weights=choice) == 3
    report = quant_linear.dense_weights_of(model)
    quantized = [m for m in model.modules() if isinstance(m, quant_linear.QuantLinear)]
    bf16_bytes = sum(p.numel() * p.element_size() for m in quantized for p in m.parameters()
                     if p.dtype == torch.bfloat16)
    if choice == "on":
        assert report.mode == "on" and report.held == copies and report.saved == 0
        assert all(m.dense is not None for m in quantized)
        assert "kept bf16 copies" in caplog.text
    else:
        assert report.mode == "off" and report.held == 0 and report.saved == copies
        assert all(m.dense is None for m in quantized) and bf16_bytes == 0
        assert f"{copies / 2**30:.2f} GiB saved" in caplog.text
        if choice == "auto":
            assert "--cpu-dense-weights auto, over" in caplog.text


def test_an_fp32_model_reports_no_copies_to_choose():
    from radixflow.runtime.models.quant_linear import dense_weights_of

    model = _model(grid=True)
    quantize_linears_(model, keep=(model.lm_head,), dtype=torch.float32, dense_weights="off")
    report = dense_weights_of(model)
    assert report.mode == "none" and report.held == report.saved == 0


def test_the_flag_parses():
    import argparse

    from radixflow.runtime.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert ServerArgs.from_cli_args(parser.parse_args([])).cpu_dense_weights == "auto"
    for value in ("on", "off", "auto"):
        args = ServerArgs.from_cli_args(parser.parse_args(["--cpu-dense-weights", value]))
        assert args.cpu_dense_weights == value
    with pytest.raises(SystemExit):
        parser.parse_args(["--cpu-dense-weights", "sometimes"])
    with pytest.raises(ValueError, match="--cpu-dense-weights must be one of"):
        ServerArgs(cpu_dense_weights="sometimes")


def _snap_to_q4_1(folder) -> None:
    """Rewrite a tiny model's linear weights as 4-bit groups with fp16 scales and minimums
    (what a Q4_1 GGUF holds), so that --quantization auto takes them as they are."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    weights = load_file(path)
    for name, w in weights.items():
        if name.endswith("proj.weight") and w.shape[1] % 32 == 0:
            q, scale, low = quantize_groups(w)
            scale, low = scale.half().float(), low.half().float()
            weights[name] = (low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
                             ).contiguous()
    save_file(weights, path, metadata={"format": "pt"})


@pytest.mark.skipif(not cpu_kernels.available() or not cpu_kernels.cpu_features().bf16,
                    reason="a bf16 model with radixflow's CPU kernels (level avx512)")
def test_a_model_without_copies_serves_the_same_greedy_output(tmp_path, monkeypatch):
    from helpers.tiny_models import make_tiny_model

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.models.quant_linear import dense_weights_of

    folder = make_tiny_model(tmp_path / "tiny", "llama")
    _snap_to_q4_1(folder)
    greedy = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    prompts = ["The quick brown fox jumps over the lazy dog and runs far away " * 3,
               *[f"request number {i} of a batch" for i in range(12)]]  # a decode batch of 13
    outputs, reports, blocks = {}, {}, []
    product = cpu_kernels.gemm_dequant
    monkeypatch.setattr(cpu_kernels, "gemm_dequant",
                        lambda x, *a, **k: blocks.append(x.shape[0]) or product(x, *a, **k))
    for choice in ("on", "off"):
        # (x exact at every row count: with int8 x from 3 rows, the prefill's products would
        # stay tiled instead of taking blocks; test_int8_x_keeps_prefill_tiled)
        with Engine(str(folder), quantization="auto", dtype="bfloat16", cpu_isa="avx512",
                    cpu_dense_weights=choice, max_total_tokens=2048,
                    cpu_batch_int8_rows=0) as engine:
            runner = engine.scheduler.runner
            assert runner.quantization == "int4"
            reports[choice] = dense_weights_of(runner.model)
            assert runner.cpu_info()["dense_weights"]["mode"] == choice
            outputs[choice] = [r["output_ids"] for r in engine.generate(prompts, greedy)]
            assert bool(blocks) == (choice == "off")  # the prefills' products
    assert reports["off"].held == 0 and reports["off"].saved == reports["on"].held > 0
    assert outputs["off"] == outputs["on"]


@pytest.mark.skipif(not cpu_kernels.available(),
                    reason="radixflow's CPU kernels do not run at this level (generic)")
def test_int8_x_keeps_prefill_tiled(monkeypatch):
    """Where the tiled kernels take x as int8 (from cpu_kernels.batch_int8_rows() rows) they
    beat blocks of bf16 rows at every row count for the 4-bit formats: a layer without a copy
    stays tiled however many rows come, and takes blocks only with exact x."""
    from radixflow.runtime.models.quant_linear import Int4Linear

    linear = torch.nn.Linear(64, 48, bias=False)
    layer = Int4Linear(linear, dtype=torch.bfloat16, dense_copy=False)
    blocks = []
    product = cpu_kernels.gemm_dequant
    monkeypatch.setattr(cpu_kernels, "gemm_dequant",
                        lambda x, *a, **k: blocks.append(x.shape[0]) or product(x, *a, **k))
    try:
        for setting, rows, takes_blocks in [(3, 100, False),
                                            (3, 2048, False),
                                            (0, 100, True)]:
            cpu_kernels.set_batch_int8_rows(setting)
            blocks.clear()
            layer(torch.randn(rows, 64, dtype=torch.bfloat16))
            assert bool(blocks) == takes_blocks, (setting, rows)
    finally:
        cpu_kernels.set_batch_int8_rows(3)
