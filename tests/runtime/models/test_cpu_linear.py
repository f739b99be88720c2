from __future__ import annotations

import pytest
import torch
from torch import nn

from radixflow.runtime.models.cpu_linear import PackedLinear, can_pack, pack_linears_

pytestmark = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.bfloat16),
                                reason="oneDNN packs bf16 weights only on a CPU with "
                                       "AVX512 BW/VL/DQ or AVX-NE-CONVERT")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
def test_packed_linear_matches_linear(bias, rows):
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear)
    x = torch.randn(rows, 96, dtype=torch.bfloat16)
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), linear(x), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(packed(x.view(1, rows, 96)), linear(x).view(1, rows, 160),
                                   atol=2e-2, rtol=2e-2)


def test_pack_linears_replaces_every_linear():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4))).bfloat16()
    assert pack_linears_(model) == 2
    assert not any(type(m) is nn.Linear for m in model.modules())
