"""Routed experts of a mixture-of-experts layer: dispatch to Triton, plus the torch reference.

Token t was routed to experts `topk_ids[t, :]` with weights `topk_weights[t, :]`; each expert
is a SwiGLU MLP whose gate and up projections are stacked in one matrix (nn.Linear layout,
gate rows first):

    out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)),  e = topk_ids[t, j]

Both paths group the (token, j) pairs by expert, so only the routed experts' weights are
read, and each expert runs one product over all of its tokens:

- torch: sort the pairs by expert, one F.linear pair per expert that has tokens, summed into
  the output with index_add_ (transformers' Qwen3MoeExperts, step for step).
- Triton (triton/moe.py): each expert's run of pairs is padded to a multiple of BLOCK_M, and
  one grouped GEMM per projection reads each block's expert weight; silu(gate) * up is fused
  into the first one's epilogue, the routing weight into the second's, and a sum over top_k
  (not atomics: deterministic) gives each token's output.

Products accumulate in fp32; the output has x's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dispatch import Backend, pick_backend


def moe_experts(
    x: torch.Tensor,  # [num_tokens, hidden]
    w_gate_up: torch.Tensor,  # [num_experts, 2 * inter, hidden]: gate rows then up rows
    w_down: torch.Tensor,  # [num_experts, hidden, inter]
    topk_ids: torch.Tensor,  # [num_tokens, top_k] int32 or int64 expert ids
    topk_weights: torch.Tensor,  # [num_tokens, top_k] float (fp32 or x.dtype)
    *,
    backend: Backend = "auto",
) -> torch.Tensor:  # [num_tokens, hidden], x.dtype
    """sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j].

    Expert ids are range-checked only on the CPU (on a GPU that would cost a sync)."""
    _check_inputs(x, w_gate_up, w_down, topk_ids, topk_weights)
    if pick_backend(backend, x) == "torch":
        return _grouped_experts(x, w_gate_up, w_down, topk_ids, topk_weights)
    from .triton.moe import moe_experts_triton

    return moe_experts_triton(x, w_gate_up, w_down, topk_ids, topk_weights)


def moe_experts_torch(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
) -> torch.Tensor:
    """The reference: tokens grouped by expert, one product per expert that has tokens."""
    _check_inputs(x, w_gate_up, w_down, topk_ids, topk_weights)
    return _grouped_experts(x, w_gate_up, w_down, topk_ids, topk_weights)


def _grouped_experts(x, w_gate_up, w_down, topk_ids, topk_weights) -> torch.Tensor:
    top_k = topk_ids.shape[1]
    out = torch.zeros_like(x)
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)  # pair p = t * top_k + j, grouped by expert
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    tokens = order // top_k
    weights = topk_weights.reshape(-1)[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = tokens[start:start + count]
        gate, up = F.linear(x[rows], w_gate_up[expert]).chunk(2, dim=-1)
        h = F.linear(F.silu(gate) * up, w_down[expert]) * weights[start:start + count, None]
        out.index_add_(0, rows, h.to(out.dtype))
        start += count
    return out


def _check_inputs(x, w_gate_up, w_down, topk_ids, topk_weights) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [num_tokens, hidden], got shape {tuple(x.shape)}")
    if w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(f"w_gate_up and w_down must be 3-D [num_experts, ...], got shapes "
                         f"{tuple(w_gate_up.shape)} and {tuple(w_down.shape)}")
    num_tokens, hidden = x.shape
    num_experts, two_inter, w_hidden = w_gate_up.shape
    if two_inter % 2 != 0:
        raise ValueError(f"w_gate_up has {two_inter} rows per expert; expected 2 * inter "
                         "(gate rows then up rows)")
    if w_hidden != hidden:
        raise ValueError(f"w_gate_up hidden size {w_hidden} != x hidden size {hidden}")
    if tuple(w_down.shape) != (num_experts, hidden, two_inter // 2):
        raise ValueError(f"w_down shape {tuple(w_down.shape)} != (num_experts, hidden, inter) "
                         f"= {(num_experts, hidden, two_inter // 2)}")
    if w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise ValueError(f"expert weights ({w_gate_up.dtype}, {w_down.dtype}) must have x's "
                         f"dtype {x.dtype}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids must be [num_tokens={num_tokens}, top_k], got shape "
                         f"{tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights shape {tuple(topk_weights.shape)} != topk_ids shape "
                         f"{tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if not topk_weights.is_floating_point():
        raise ValueError(f"topk_weights must be floating point, got {topk_weights.dtype}")
    if topk_ids.shape[1] > num_experts:
        raise ValueError(f"top_k {topk_ids.shape[1]} > num_experts {num_experts}")
    devices = {t.device for t in (x, w_gate_up, w_down, topk_ids, topk_weights)}
    if len(devices) != 1:
        raise ValueError(f"inputs are on different devices: {sorted(map(str, devices))}")
    if topk_ids.device.type == "cpu" and topk_ids.numel() > 0:
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"topk_ids out of range: [{lo}, {hi}] with {num_experts} experts")
