"""Weight-only 4-bit linear layers for CPU decode (`--quantization int4`).

Single-stream decode on a CPU is bound by reading the weights: 4-bit weights are a quarter of
bf16's bytes. Each row is quantized in groups of 32 input features, asymmetric min-max (the
Q4_1 scheme the default model's GGUF itself uses), and multiplied by torch's packed int4 CPU
kernel, which dequantizes on the fly.

That kernel only wins for a few rows: measured over the default model's 120 layer matmuls,
1 row took 6.1 ms in int4 vs 25.6 ms in bf16, 4 rows 9.3 vs 14.4 ms, 6 rows 16.1 vs 15.7 ms,
and at 16 rows int4 was 3.6x slower. So each Int4Linear keeps a bf16 copy of its (dequantized)
weights for prefill and large decode batches.
"""

from __future__ import annotations

import torch
from torch import nn

from .cpu_linear import PackedLinear, can_pack

GROUP_SIZE = 32
INT4_MAX_ROWS = 4  # more rows than this go through the bf16 weights (see the module doc)


def can_quantize_int4(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def quantize_groups(weight: torch.Tensor, group_size: int = GROUP_SIZE):
    """weight [N, K] -> (q [N, K] int32 in 0..15, scale [N, K/g], low [N, K/g]) with
    weight ~= low + q * scale."""
    n, k = weight.shape
    groups = weight.float().view(n, k // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-10)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return q.to(torch.int32).view(n, k), scale, low


class Int4Linear(nn.Module):
    def __init__(self, linear: nn.Linear, group_size: int = GROUP_SIZE,
                 groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
        """`groups`: `quantize_groups(linear.weight)` when the caller already has it."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if self.in_features % group_size:
            raise ValueError(f"int4 needs in_features divisible by {group_size}, "
                             f"got {self.in_features}")
        self.group_size = group_size
        q, scale, low = groups or quantize_groups(linear.weight.detach(), group_size)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        # the kernel computes (q - 8) * scale + zero
        zero = low + 8 * scale
        # [K/g, N, 2]
        self.scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous() \
            .to(torch.bfloat16)
        self.bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        dense = nn.Linear(self.in_features, self.out_features, bias=linear.bias is not None,
                          dtype=torch.bfloat16, device="meta")
        dense.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        if linear.bias is not None:
            dense.bias = nn.Parameter(self.bias, requires_grad=False)
        self.dense = PackedLinear(dense) if can_pack(dense.weight.device, torch.bfloat16) else dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if rows.shape[0] > INT4_MAX_ROWS:
            out = self.dense(rows)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows, self.packed, self.group_size, self.scales_and_zeros)
            if self.bias is not None:
                out = out + self.bias
        return out.view(*shape[:-1], self.out_features).to(x.dtype)


def is_exact(weight: torch.Tensor, groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             group_size: int = GROUP_SIZE) -> bool:
    """Whether `groups` (from quantize_groups) rebuild `weight` exactly, as they do for weights
    dequantized from a Q4_0/Q4_1 GGUF: then int4 loses nothing but the scales' bf16 rounding."""
    q, scale, low = groups
    n, k = weight.shape
    w = weight.detach().float().view(n, k // group_size, group_size)
    rebuilt = low[..., None] + q.view_as(w).float() * scale[..., None]
    return bool(((rebuilt - w).abs() <= 1e-6 * w.abs().amax(-1, keepdim=True)).all())


def _quantizable(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(module, name, child) for module in model.modules()
            for name, child in module.named_children()
            if type(child) is nn.Linear and child.in_features % GROUP_SIZE == 0]


def quantize_linears_int4_(model: nn.Module, keep: tuple[nn.Module, ...] = (),
                           only_if_exact: bool = False) -> int:
    """Replace the model's nn.Linears (with in_features divisible by the group size) by
    Int4Linears; returns how many were replaced. Quantize fp32 weights, before any bf16 cast.

    - `keep`: linears that stay as they are unless their weights are already 4-bit. For the
      output head: the default model's GGUF stores its (tied) embedding at 8 bits, and 4-bit
      logits cost more quality than the head's bytes are worth.
    - `only_if_exact`: replace nothing (return 0) unless every other linear's weights are
      already 4-bit (see is_exact), i.e. int4 is lossless for this checkpoint.
    """
    plan = []
    for module, name, linear in _quantizable(model):
        groups = quantize_groups(linear.weight.detach())
        exact = is_exact(linear.weight, groups)
        if linear in keep and not exact:
            continue
        if only_if_exact and not exact:
            return 0
        plan.append((module, name, linear, groups))
    for module, name, linear, groups in plan:
        setattr(module, name, Int4Linear(linear, groups=groups))
    return len(plan)
