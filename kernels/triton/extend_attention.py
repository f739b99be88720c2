"""Triton extend (prefill) attention: new tokens over their cached prefix + causally over
themselves, many requests of different lengths in one launch. Semantics: kernels/attention.py.

One program computes a BLOCK_M x head_dim tile of one query head of one request: first the
prefix, gathered from the KV pool through req_to_token, then the new tokens' own K/V (read
contiguously from k/v), unmasked below the diagonal tile and causally masked on it.

A sliding window (WINDOWED; `window`: the query at position p sees keys p - window < k <= p)
starts each of those loops at the first key tile any row of the query tile sees, masks the
tiles some row sees only in part (and the diagonal tile), and runs the tiles every row sees
in full unmasked, as without a window.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import (
    dequantize_keys,
    dequantize_values,
    dot,
    dot_options,
    kv_tensors,
    needs_int64,
)

_LOG2E = 1.0 / math.log(2.0)


@triton.jit
def _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                         EMPTY_ROWS: tl.constexpr = False):
    """One flash-attention update; qk is already in log2 units. EMPTY_ROWS: a row may have
    seen no key yet, this tile included (all -inf: a window's edge), and must stay empty."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = m_new
    if EMPTY_ROWS:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(qk - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["Window"])
def _extend_attention_kernel(
    Q, K, V, O, K_cache, V_cache, K_scale, V_scale,
    Req_to_token, Req_pool_indices, Prefix_lens, Extend_lens, Extend_starts,
    qk_scale,  # softmax scale * log2(e)
    Window,  # WINDOWED: the query at position p sees keys p - Window < k <= p
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_o_t, stride_o_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_req,
    stride_ks_s, stride_vs_s,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    INT64: tl.constexpr,  # element offsets that may pass 2**31
    WINDOWED: tl.constexpr,
    KV_INT8: tl.constexpr,  # the cache: int8 codes, times K_scale / V_scale [slots, kv_heads]
):
    # Largest M blocks first: under causal masking they are the slowest.
    block_m = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    req = tl.program_id(2)
    extend_len = tl.load(Extend_lens + req).to(tl.int32)
    start_m = block_m * BLOCK_M
    if start_m >= extend_len:
        return
    kv_head = head // GROUP
    prefix_len = tl.load(Prefix_lens + req).to(tl.int32)
    first_row = tl.load(Extend_starts + req).to(tl.int32)
    req_row = tl.load(Req_pool_indices + req).to(tl.int32)
    if INT64:
        first_row = first_row.to(tl.int64)
        req_row = req_row.to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < extend_len
    mask_d = offs_d < HEAD_DIM
    rows_m = first_row + offs_m
    q = tl.load(Q + head * stride_q_h + (rows_m[:, None] * stride_q_t + offs_d[None, :]),
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    K_cache += kv_head * stride_kc_h
    V_cache += kv_head * stride_vc_h
    K_scale += kv_head
    V_scale += kv_head
    K += kv_head * stride_k_h
    V += kv_head * stride_v_h

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # The cached prefix, gathered through the token-slot table. Window: the tiles from
    # prefix_lo (the tile's first query sees no key before it) to prefix_full are masked, the
    # rest every row sees whole (its last row, at q_first + BLOCK_M - 1, sees from
    # q_first + BLOCK_M - Window).
    prefix_full = 0
    if WINDOWED:
        q_first = prefix_len + start_m
        prefix_lo = tl.maximum(q_first - Window + 1, 0) // BLOCK_N * BLOCK_N
        prefix_full = prefix_lo + tl.cdiv(tl.maximum(q_first + BLOCK_M - Window - prefix_lo, 0),
                                          BLOCK_N) * BLOCK_N
        prefix_full = tl.minimum(prefix_full, prefix_len)
        for start_n in range(prefix_lo, prefix_full, BLOCK_N):
            cols = start_n + offs_n
            mask_n = cols < prefix_len
            slots = tl.load(Req_to_token + req_row * stride_req + cols, mask=mask_n, other=0)
            if INT64:
                slots = slots.to(tl.int64)
            k = tl.load(K_cache + (slots[None, :] * stride_kc_s + offs_d[:, None]),
                        mask=mask_n[None, :] & mask_d[:, None], other=0.0)
            if KV_INT8:
                k = dequantize_keys(k, K_scale, slots, stride_ks_s, mask_n, q.dtype)
            qk = dot(q, k, PRECISION, UPCAST) * qk_scale
            visible = mask_n[None, :] & (cols[None, :] > prefix_len + offs_m[:, None] - Window)
            qk = tl.where(visible, qk, float("-inf"))
            v = tl.load(V_cache + (slots[:, None] * stride_vc_s + offs_d[None, :]),
                        mask=mask_n[:, None] & mask_d[None, :], other=0.0)
            if KV_INT8:
                v = dequantize_values(v, V_scale, slots, stride_vs_s, mask_n, q.dtype)
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST, True)
    for start_n in range(prefix_full, prefix_len, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < prefix_len
        slots = tl.load(Req_to_token + req_row * stride_req + cols, mask=mask_n, other=0)
        if INT64:
            slots = slots.to(tl.int64)
        k = tl.load(K_cache + (slots[None, :] * stride_kc_s + offs_d[:, None]),
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        if KV_INT8:
            k = dequantize_keys(k, K_scale, slots, stride_ks_s, mask_n, q.dtype)
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale  # [BLOCK_M, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        v = tl.load(V_cache + (slots[:, None] * stride_vc_s + offs_d[None, :]),
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        if KV_INT8:
            v = dequantize_values(v, V_scale, slots, stride_vs_s, mask_n, q.dtype)
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST)

    # New tokens strictly before this tile: every query row sees all of them (a window: those
    # from own_full on; the ones from own_lo masked).
    own_full = 0
    if WINDOWED:
        own_lo = tl.maximum(start_m - Window + 1, 0) // BLOCK_N * BLOCK_N
        own_full = own_lo + tl.cdiv(tl.maximum(start_m + BLOCK_M - Window - own_lo, 0),
                                    BLOCK_N) * BLOCK_N
        own_full = tl.minimum(own_full, start_m)
        for start_n in range(own_lo, own_full, BLOCK_N):
            cols = start_n + offs_n
            rows_n = first_row + cols
            k = tl.load(K + (rows_n[None, :] * stride_k_t + offs_d[:, None]),
                        mask=mask_d[:, None], other=0.0)
            qk = dot(q, k, PRECISION, UPCAST) * qk_scale
            qk = tl.where(cols[None, :] > offs_m[:, None] - Window, qk, float("-inf"))
            v = tl.load(V + (rows_n[:, None] * stride_v_t + offs_d[None, :]),
                        mask=mask_d[None, :], other=0.0)
            m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST, True)
    for start_n in range(own_full, start_m, BLOCK_N):
        rows_n = first_row + start_n + offs_n
        k = tl.load(K + (rows_n[None, :] * stride_k_t + offs_d[:, None]), mask=mask_d[:, None],
                    other=0.0)
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale
        v = tl.load(V + (rows_n[:, None] * stride_v_t + offs_d[None, :]), mask=mask_d[None, :],
                    other=0.0)
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST)

    # The diagonal tile: causal mask.
    end_n = tl.minimum(start_m + BLOCK_M, extend_len)
    for start_n in range(start_m, end_n, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < extend_len
        rows_n = first_row + cols
        k = tl.load(K + (rows_n[None, :] * stride_k_t + offs_d[:, None]),
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale
        visible = mask_n[None, :] & (cols[None, :] <= offs_m[:, None])
        if WINDOWED:
            visible = visible & (cols[None, :] > offs_m[:, None] - Window)
        qk = tl.where(visible, qk, float("-inf"))
        v = tl.load(V + (rows_n[:, None] * stride_v_t + offs_d[None, :]),
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        m_i, l_i, acc = _online_softmax_step(qk, v, m_i, l_i, acc, PRECISION, UPCAST, WINDOWED)

    if WINDOWED:  # rows past extend_len may have seen no key (not stored)
        l_i = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_i[:, None]
    tl.store(O + head * stride_o_h + (rows_m[:, None] * stride_o_t + offs_d[None, :]),
             out.to(O.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])


def extend_attention_triton(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices,
                            prefix_lens, extend_lens, extend_starts, *, scale: float,
                            max_extend_len: int | None = None,
                            window: int | None = None) -> torch.Tensor:
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    (k_cache, k_scale), (v_cache, v_scale), kv_int8 = kv_tensors(k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    bs = extend_lens.shape[0]
    out = torch.empty_like(q)
    if bs == 0 or num_tokens == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int(extend_lens.max())
    block_d = triton.next_power_of_2(head_dim)
    block_m, block_n, num_warps, num_stages = _tile_config(q, block_d)
    grid = (triton.cdiv(max_extend_len, block_m), num_heads, bs)
    _extend_attention_kernel[grid](
        q, k, v, out, k_cache, v_cache, k_scale, v_scale,
        req_to_token, req_pool_indices, prefix_lens, extend_lens, extend_starts,
        scale * _LOG2E, window or 0,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0), k_scale.stride(0),
        v_scale.stride(0),
        GROUP=num_heads // k_cache.shape[1],
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        **dot_options(q),
        INT64=needs_int64(q, k, v, out, k_cache, v_cache, req_to_token),
        WINDOWED=window is not None,
        KV_INT8=kv_int8,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def _tile_config(q: torch.Tensor, block_d: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_M must be a multiple of BLOCK_N.

    Picked so that ptxas reports no register spills for sm_90 (bf16/fp16; sm_80 spills a
    little at head_dim 128), checked by compiling for the target without a GPU."""
    if not q.is_cuda:  # the interpreter: big tiles mean fewer Python-level steps
        return 32, 32, 4, 1
    if q.dtype == torch.float32:  # tf32x3 products need more registers
        return (64, 32, 4, 1) if block_d <= 64 else (64, 16, 4, 1)
    if block_d <= 64:
        return 128, 64, 8, 2
    major, _ = torch.cuda.get_device_capability(q.device)
    return (128, 32, 8, 2) if major >= 8 else (64, 32, 4, 2)


def warm_up_extend_attention(k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, *, num_heads: int, scale: float,
                             windowed: bool = False, q_dtype: torch.dtype | None = None) -> None:
    """Launch the extend kernel once over these pools (one new token, no prefix), so triton
    compiles the variant a serving backend uses: its tile configuration depends only on the
    device, dtype and head size, and its lengths are int64 like the backend's. `windowed`: the
    sliding-window variant too (a model with windowed layers)."""
    device = k_cache.device
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    q = torch.zeros((1, num_heads, head_dim), dtype=q_dtype or k_cache.dtype, device=device)
    kv = torch.zeros((1, num_kv_heads, head_dim), dtype=q.dtype, device=device)
    zero = torch.zeros(1, dtype=torch.int64, device=device)
    for w in (None, 1) if windowed else (None,):  # (any window: it is not specialised on)
        extend_attention_triton(q, kv, kv, k_cache, v_cache, req_to_token, zero, zero, zero + 1,
                                zero, scale=scale, max_extend_len=1, window=w)
