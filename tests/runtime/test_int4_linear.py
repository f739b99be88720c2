from __future__ import annotations

import pytest
import torch
from torch import nn

from radixflow.runtime.models.int4_linear import Int4Linear, can_quantize_int4, quantize_groups

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


@pytest.mark.parametrize("rows", [1, 5, 33])
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
