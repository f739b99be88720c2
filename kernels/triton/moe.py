"""Triton grouped-expert MLP (fused MoE, as vLLM / SGLang do it). Semantics: kernels/moe.py.

Pair p = t * top_k + j is token t's j-th routed expert. `align_pairs_by_expert` sorts the
pairs by expert and pads each expert's run to a multiple of BLOCK_M with a sentinel pair id
(num_pairs), so every block of BLOCK_M sorted pairs belongs to one expert. Then two grouped
GEMMs, one program per (block, N tile), each reading only its block's expert weight:

1. h[p] = silu(x[t] @ gate_e.T) * (x[t] @ up_e.T)      [num_pairs, inter]
2. y[p] = topk_weights[p] * (h[p] @ down_e.T)           [num_pairs, hidden]

and out[t] = sum_j y[t * top_k + j], a reduction over top_k (no atomics: deterministic).
Products accumulate in fp32; h and y are stored in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import dot, dot_options, needs_int64


@triton.jit
def _gate_up_kernel(
    X, W, H, Sorted_pairs, Block_experts,
    num_pairs, num_experts, hidden, inter,
    stride_x_t, stride_x_k, stride_w_e, stride_w_n, stride_w_k, stride_h_p, stride_h_n,
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    INT64: tl.constexpr,  # element offsets into x / h that may pass 2**31
):
    block = tl.program_id(0)
    expert = tl.load(Block_experts + block)
    if expert >= num_experts:  # past the last padded block
        return
    pairs = tl.load(Sorted_pairs + block * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    tokens = pairs // TOP_K
    if INT64:
        pairs = pairs.to(tl.int64)
        tokens = tokens.to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)

    x_ptrs = X + (tokens[:, None] * stride_x_t + offs_k[None, :] * stride_x_k)
    # [BLOCK_K, BLOCK_N] tiles of gate_e.T and up_e.T; the expert offset is 64-bit because
    # all experts' weights together easily pass 2**31 elements.
    g_ptrs = (W + expert.to(tl.int64) * stride_w_e
              + (offs_n[None, :] * stride_w_n + offs_k[:, None] * stride_w_k))
    u_ptrs = g_ptrs + inter * stride_w_n
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, hidden, BLOCK_K):
        mask_k = offs_k < hidden - k
        a = tl.load(x_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        mask_w = mask_k[:, None] & mask_n[None, :]
        acc_gate += dot(a, tl.load(g_ptrs, mask=mask_w, other=0.0), PRECISION, UPCAST)
        acc_up += dot(a, tl.load(u_ptrs, mask=mask_w, other=0.0), PRECISION, UPCAST)
        x_ptrs += BLOCK_K * stride_x_k
        g_ptrs += BLOCK_K * stride_w_k
        u_ptrs += BLOCK_K * stride_w_k

    # gate and up rounded to h's dtype first, as an unfused gate_up product would leave them
    gate = acc_gate.to(H.dtype.element_ty).to(tl.float32)
    up = acc_up.to(H.dtype.element_ty).to(tl.float32)
    h = gate * tl.sigmoid(gate) * up
    tl.store(H + (pairs[:, None] * stride_h_p + offs_n[None, :] * stride_h_n),
             h.to(H.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(
    H, W, Y, Sorted_pairs, Block_experts, Pair_weights,
    num_pairs, num_experts, hidden, inter,
    stride_h_p, stride_h_k, stride_w_e, stride_w_n, stride_w_k, stride_y_p, stride_y_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    INT64: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(Block_experts + block)
    if expert >= num_experts:
        return
    pairs = tl.load(Sorted_pairs + block * BLOCK_M + tl.arange(0, BLOCK_M))
    mask_m = pairs < num_pairs
    if INT64:
        pairs = pairs.to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < hidden
    offs_k = tl.arange(0, BLOCK_K)

    h_ptrs = H + (pairs[:, None] * stride_h_p + offs_k[None, :] * stride_h_k)
    w_ptrs = (W + expert.to(tl.int64) * stride_w_e
              + (offs_n[None, :] * stride_w_n + offs_k[:, None] * stride_w_k))
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, inter, BLOCK_K):
        mask_k = offs_k < inter - k
        a = tl.load(h_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc += dot(a, b, PRECISION, UPCAST)
        h_ptrs += BLOCK_K * stride_h_k
        w_ptrs += BLOCK_K * stride_w_k

    weight = tl.load(Pair_weights + pairs, mask=mask_m, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(Y + (pairs[:, None] * stride_y_p + offs_n[None, :] * stride_y_n),
             acc.to(Y.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def align_pairs_by_expert(
    topk_ids: torch.Tensor,  # [num_tokens, top_k]
    num_experts: int,
    block_m: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted_pairs [max_blocks * block_m] int32, block_experts [max_blocks] int32).

    sorted_pairs lists the pair ids p = t * top_k + j grouped by expert (ascending p within
    an expert), each expert's run padded to a multiple of block_m with num_pairs; block b's
    pairs all go to expert block_experts[b]. max_blocks is a host-side bound on the padded
    block count, so nothing here waits on the device: blocks past the real ones are all
    padding and have block_experts == num_experts."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    num_pairs = flat.numel()
    # each expert with pairs pads fewer than block_m of them, and every block holds a pair
    max_blocks = min(num_pairs, (num_pairs + min(num_experts, num_pairs) * (block_m - 1))
                     // block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    blocks = (counts + block_m - 1) // block_m
    block_end = blocks.cumsum(0)
    padded_start = (block_end - blocks) * block_m
    start = counts.cumsum(0) - counts
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    dest = padded_start[experts] + torch.arange(num_pairs, device=device) - start[experts]
    sorted_pairs = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32,
                              device=device)
    sorted_pairs[dest] = order.to(torch.int32)
    block_experts = torch.searchsorted(
        block_end, torch.arange(max_blocks, device=device), right=True).to(torch.int32)
    return sorted_pairs, block_experts


def moe_experts_triton(x, w_gate_up, w_down, topk_ids, topk_weights) -> torch.Tensor:
    num_tokens, hidden = x.shape
    num_experts, inter = w_down.shape[0], w_down.shape[2]
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    cfg = _tile_config(x, num_pairs, num_experts)
    sorted_pairs, block_experts = align_pairs_by_expert(topk_ids, num_experts, cfg["BLOCK_M"])
    num_blocks = block_experts.shape[0]
    pair_weights = topk_weights.reshape(-1).contiguous()
    h = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)
    y = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)
    int64 = needs_int64(x, h, y)
    launch = {"BLOCK_M": cfg["BLOCK_M"], **dot_options(x), "INT64": int64,
              "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}

    block_n, block_k = _block_nk(cfg, inter, hidden)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w_gate_up, h, sorted_pairs, block_experts,
        num_pairs, num_experts, hidden, inter,
        x.stride(0), x.stride(1), w_gate_up.stride(0), w_gate_up.stride(1), w_gate_up.stride(2),
        h.stride(0), h.stride(1),
        TOP_K=top_k, BLOCK_N=block_n, BLOCK_K=block_k, **launch,
    )
    block_n, block_k = _block_nk(cfg, hidden, inter)
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        h, w_down, y, sorted_pairs, block_experts, pair_weights,
        num_pairs, num_experts, hidden, inter,
        h.stride(0), h.stride(1), w_down.stride(0), w_down.stride(1), w_down.stride(2),
        y.stride(0), y.stride(1),
        BLOCK_N=block_n, BLOCK_K=block_k, **launch,
    )
    if top_k == 1:
        return y
    # a bf16 / fp16 sum accumulates in fp32 and rounds once
    return y.view(num_tokens, top_k, hidden).sum(dim=1)


def _tile_config(x: torch.Tensor, num_pairs: int, num_experts: int) -> dict[str, int]:
    """BLOCK_M, caps on BLOCK_N / BLOCK_K, num_warps, num_stages: small blocks when experts
    average few pairs (decode), as vLLM's untuned defaults do. Picked so that ptxas reports
    no register spills for sm_90 (sm_80: 8 bytes in the bf16 gate_up kernel at BLOCK_M 64),
    checked by compiling for the target without a GPU; not yet timed on one."""
    if not x.is_cuda:  # the interpreter: big tiles mean fewer Python-level steps
        return {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 4, "num_stages": 1}
    few = num_pairs <= 4 * num_experts
    if x.dtype == torch.float32:  # tf32x3 products need more registers
        if few:
            return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
        return {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 2}
    if few:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}


def _block_nk(cfg: dict[str, int], n: int, k: int) -> tuple[int, int]:
    # tl.dot needs every tile side >= 16
    return (max(16, min(cfg["BLOCK_N"], triton.next_power_of_2(n))),
            max(16, min(cfg["BLOCK_K"], triton.next_power_of_2(k))))
