"""Linear layers with oneDNN-prepacked weights for bf16 on CPU.

A plain bf16 `nn.Linear` on CPU reorders its weight into oneDNN's blocked layout on every
call, which reads and writes the whole weight again: at decode batch sizes that costs several
times the matmul itself. Packing once at load time (what inductor's freezing pass does) removes it.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from radixflow.kernels.cpu.features import cpu_features

logger = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_size_hint: int = 1):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, batch_size_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.mkldnn._linear_pointwise(
            x.reshape(-1, self.in_features), self.packed_weight, self.bias, "none", [], "")
        return out.view(*shape[:-1], self.out_features)


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and cpu_features().onednn_bf16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_linears_(model: nn.Module) -> int:
    """Replace every nn.Linear in `model` by a PackedLinear; returns how many were replaced."""
    count = 0
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, PackedLinear(child))
                count += 1
    logger.debug("packed %d linear layers for oneDNN", count)
    return count
