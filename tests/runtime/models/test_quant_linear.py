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


def test_explicit_int4_quantizes_dense_weights_but_keeps_the_head():
    torch.manual_seed(4)
    model = _model(grid=False)
    head = model.lm_head.weight.detach().clone()
    kept = 1 if cpu_kernels.available() else 0
    assert quantize_linears_(model, keep=(model.lm_head,)) == 2 + kept
    _assert_head_kept_in_bf16(model, head)


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
