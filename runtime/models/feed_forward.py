"""The gated MLP every family's block uses: gate and up fused into one matmul, then down.

Its own module because the dense blocks (llama.py) and the experts (moe.py) both build it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels.cpu.rows import RowKernels

from .config import ModelArgs

# on a CPU a prefill's rows go through the MLP this many at a time: its gate/up activations
# (the largest a prefill makes: 1,000 rows of a 1B's take 33 + 16 MB) stay a few MB, so glibc's
# heap, which fragments around them, grows less (a 1B server's peak 2.86 -> 2.75 GB with the
# rest of the change), and the tiled kernels run as fast per row (one 1B layer's linears:
# 30 ms at 256 rows, 149 at 1,024)
ROWS_PER_PASS = 128


class FeedForward(nn.Module):
    rows: RowKernels | None = None

    def __init__(self, args: ModelArgs, *, intermediate_size: int | None = None,
                 bias: bool | None = None):
        """The dense MLP of `args`, or (moe.py) an expert of its own size."""
        super().__init__()
        inter = self.intermediate_size = intermediate_size or args.intermediate_size
        bias = args.mlp_bias if bias is None else bias
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * inter, bias=bias)
        self.down_proj = nn.Linear(inter, args.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        step = ROWS_PER_PASS
        if self.rows is None or x.dim() != 2 or x.shape[0] <= step:  # (rows: a CPU's kernels)
            return self._rows(x)
        return torch.cat([self._rows(x[i:i + step]) for i in range(0, x.shape[0], step)])

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        act = self.rows.silu_mul(gate_up) if self.rows is not None else None
        if act is None:
            gate, up = gate_up.split(self.intermediate_size, dim=-1)
            act = F.silu(gate) * up
        return self.down_proj(act)
