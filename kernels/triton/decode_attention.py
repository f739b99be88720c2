"""Triton decode attention over the token-slot table, split-KV (flash-decoding).

Stage 1: program (request, head block, split) reads one slice of the request's context through
req_to_token and attends with all query heads that share the KV head (GQA: the K/V tile is
loaded once per group), writing a partial output and its log-sum-exp. Stage 2: program
(request, head) merges the splits. Semantics: kernels/attention.py.

Split boundaries, shared by both stages: split_len = cdiv(cdiv(seq_len, num_splits), BLOCK_N)
* BLOCK_N; split s covers [s * split_len, min((s + 1) * split_len, seq_len)), possibly empty.
The split count comes from a small fixed set (decode_plan.py), and `warm_up_decode_attention`
compiles every variant a server can launch before its first request.

Shared prefixes (FlashInfer's cascade): requests of the batch whose slot rows begin with the
same `min_shared_prefix` or more slots (the radix cache gives a shared prompt prefix the same
slots) attend over that prefix together. `plan_shared_prefix` (decode_plan.py) finds them on
the device, without a host sync. Stage 1 then covers only each request's keys after its group's
prefix (from the prefix rounded down to BLOCK_N, split as above, the prefix's keys in its first
tile masked), and decode_shared_prefix.py's kernel attends the members over the prefix,
writing its partials after stage 1's; stage 2 merges both by log-sum-exp.

A sliding window (`window`: the query, at position seq_len - 1, sees the keys from
seq_len - window on) is stage 1's `first` key the same way, with no cascade: the splits cover
the window from its start rounded down to BLOCK_N, the keys before it in its first tile masked,
and stage 2 merges the splits that were written (the partials start as -inf, as the cascade's).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .common import dequantize_keys, dequantize_values, dot, dot_options, kv_tensors
from .decode_plan import (
    MAX_KV_SPLITS,
    MIN_SHARED_PREFIX,
    SHARED_ROWS,
    SharedPrefix,
    choose_num_kv_splits,
    decode_variants,
    heads_per_program,
    plan_shared_prefix,
    programs_per_split,
    shared_prefix_warps,
    shares_prefixes,
)
from .decode_shared_prefix import _shared_prefix_kernel

__all__ = ["SharedPrefix", "decode_attention_triton", "plan_shared_prefix",
           "warm_up_decode_attention"]

_LOG2E = 1.0 / math.log(2.0)


@triton.jit(do_not_specialize=["Window"])
def _decode_split_kernel(
    Q, K_cache, V_cache, K_scale, V_scale, Req_to_token, Req_pool_indices, Seq_lens, Mid_o,
    Mid_lse,
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_req,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_ks_s, stride_vs_s,
    Shared_lens,  # [bs]: keys before the request's own (a shared prefix's), or unused
    Window,  # WINDOWED: the query sees the keys from seq_len - Window on
    GROUP: tl.constexpr,  # query heads per KV head
    HEADS_PER_PROGRAM: tl.constexpr,
    HEAD_BLOCKS_PER_KV: tl.constexpr,
    BLOCK_H: tl.constexpr,  # HEADS_PER_PROGRAM padded to a power of two >= 16 (tl.dot)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    SHARED: tl.constexpr,  # Shared_lens holds each request's shared prefix, skipped here
    WINDOWED: tl.constexpr,  # (never with SHARED)
    KV_INT8: tl.constexpr,  # int8 codes, times K_scale / V_scale [slots, kv_heads] (fp16)
):
    req = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    seq_len = tl.load(Seq_lens + req).to(tl.int32)
    first = 0  # the first key of its own; tiles stay aligned to BLOCK_N, its prefix masked
    if SHARED:
        first = tl.load(Shared_lens + req).to(tl.int32)
    if WINDOWED:
        first = tl.maximum(seq_len - Window, 0)
    base = first // BLOCK_N * BLOCK_N
    split_len = tl.cdiv(tl.cdiv(seq_len - base, num_splits), BLOCK_N) * BLOCK_N
    split_start = base + split * split_len
    split_end = tl.minimum(split_start + split_len, seq_len)
    if tl.maximum(split_start, first) >= split_end:
        return

    kv_head = head_block // HEAD_BLOCKS_PER_KV
    offs_h = tl.arange(0, BLOCK_H)
    local_head = (head_block % HEAD_BLOCKS_PER_KV) * HEADS_PER_PROGRAM + offs_h
    heads = kv_head * GROUP + local_head
    mask_h = (offs_h < HEADS_PER_PROGRAM) & (local_head < GROUP)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)
    req_row = tl.load(Req_pool_indices + req).to(tl.int64)
    K_cache += kv_head * stride_kc_h
    V_cache += kv_head * stride_vc_h
    K_scale += kv_head
    V_scale += kv_head

    q = tl.load(Q + req * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start_n in range(split_start, split_end, BLOCK_N):
        cols = start_n + offs_n
        mask_n = (cols < split_end) & (cols >= first)
        slots = tl.load(Req_to_token + req_row * stride_req + cols, mask=mask_n, other=0)
        # NOTE: int64 offsets here compile to fewer registers than int32 ones (sm_90, ptxas).
        slots = slots.to(tl.int64)
        k = tl.load(K_cache + (slots[None, :] * stride_kc_s + offs_d[:, None]),
                    mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        if KV_INT8:
            k = dequantize_keys(k, K_scale, slots, stride_ks_s, mask_n, q.dtype)
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale  # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        v = tl.load(V_cache + (slots[:, None] * stride_vc_s + offs_d[None, :]),
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        if KV_INT8:
            v = dequantize_values(v, V_scale, slots, stride_vs_s, mask_n, q.dtype)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new

    tl.store(Mid_o + req * stride_mo_b + heads[:, None] * stride_mo_h + split * stride_mo_s
             + offs_d[None, :], acc / l_i[:, None], mask=mask_h[:, None] & mask_d[None, :])
    tl.store(Mid_lse + req * stride_ml_b + heads * stride_ml_h + split, m_i + tl.log2(l_i),
             mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    Mid_o, Mid_lse, Seq_lens, O,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_o_b, stride_o_h,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,  # stage 1's, for the split boundaries
    FILLED: tl.constexpr,  # Mid_lse starts as -inf: a split no program wrote is empty
):
    req = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    if FILLED:
        lse = tl.load(Mid_lse + req * stride_ml_b + head * stride_ml_h + offs_s,
                      mask=offs_s < NUM_SPLITS, other=float("-inf"))
        valid = lse > float("-inf")
    else:
        seq_len = tl.load(Seq_lens + req).to(tl.int32)
        split_len = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        valid = (offs_s < NUM_SPLITS) & (offs_s * split_len < seq_len)
        lse = tl.load(Mid_lse + req * stride_ml_b + head * stride_ml_h + offs_s, mask=valid,
                      other=float("-inf"))  # [BLOCK_S], log2 units
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # seq_len 0: all splits empty
    weights = tl.exp2(lse - lse_max)
    o = tl.load(Mid_o + req * stride_mo_b + head * stride_mo_h + offs_s[:, None] * stride_mo_s
                + offs_d[None, :], mask=valid[:, None] & mask_d[None, :], other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(weights[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(O + req * stride_o_b + head * stride_o_h + offs_d, out.to(O.dtype.element_ty),
             mask=mask_d)


def decode_attention_triton(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, *,
                            scale: float, num_kv_splits: int | None = None,
                            max_seq_len: int | None = None,
                            shared_prefix: SharedPrefix | None | str = "auto",
                            min_shared_prefix: int = MIN_SHARED_PREFIX,
                            window: int | None = None) -> torch.Tensor:
    """shared_prefix: a `plan_shared_prefix` plan, "auto" (plan here, with
    min_shared_prefix), or None (every request attends alone). window: each query sees only
    its last `window` keys; such a call never runs the cascade."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    (k_cache, k_scale), (v_cache, v_scale), kv_int8 = kv_tensors(k_cache, v_cache)
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    out = torch.empty_like(q)
    if bs == 0:
        return out
    group = num_heads // num_kv_heads
    per_program = heads_per_program(num_heads, num_kv_heads)
    head_blocks_per_kv = triton.cdiv(group, per_program)
    if num_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_kv_splits = choose_num_kv_splits(
            q.device, programs_per_split(bs, num_heads, num_kv_heads),
            max_seq_len if window is None else min(max_seq_len, window))
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")
    cascade = window is None and shares_prefixes(num_heads, num_kv_heads)
    if isinstance(shared_prefix, str):
        if shared_prefix != "auto":
            raise ValueError(f"shared_prefix must be a plan, 'auto' or None, not {shared_prefix!r}")
        shared_prefix = plan_shared_prefix(
            req_to_token, req_pool_indices, seq_lens, max_seq_len=max_seq_len,
            min_shared_prefix=min_shared_prefix) if cascade else None
    shared = shared_prefix is not None and cascade
    block_d = triton.next_power_of_2(head_dim)
    block_n = 64 if q.is_cuda else 32
    total_splits = 2 * num_kv_splits if shared else num_kv_splits  # then: own keys', prefix's
    filled = shared or window is not None  # split boundaries not those of [0, seq_len)
    mid_o = torch.empty((bs, num_heads, total_splits, head_dim), dtype=torch.float32,
                        device=q.device)
    if filled:  # a split no program writes (empty) stays -inf
        mid_lse = torch.full((bs, num_heads, total_splits), float("-inf"), dtype=torch.float32,
                             device=q.device)
    else:
        mid_lse = torch.empty((bs, num_heads, total_splits), dtype=torch.float32,
                              device=q.device)
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
               v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
               mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0),
               mid_lse.stride(1), k_scale.stride(0), v_scale.stride(0))

    _decode_split_kernel[(bs, num_kv_heads * head_blocks_per_kv, num_kv_splits)](
        q, k_cache, v_cache, k_scale, v_scale, req_to_token, req_pool_indices, seq_lens, mid_o,
        mid_lse, scale * _LOG2E, *strides,
        shared_prefix.lens if shared else seq_lens, window or 0,
        GROUP=group,
        HEADS_PER_PROGRAM=per_program,
        HEAD_BLOCKS_PER_KV=head_blocks_per_kv,
        BLOCK_H=max(16, triton.next_power_of_2(per_program)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        **dot_options(q),
        SHARED=shared,
        WINDOWED=window is not None,
        KV_INT8=kv_int8,
        num_warps=4,
        num_stages=2,
    )
    if shared:
        block_r = max(1, SHARED_ROWS // group)
        block_m = max(16, triton.next_power_of_2(block_r * group))
        _shared_prefix_kernel[(bs, num_kv_heads, num_kv_splits)](
            q, k_cache, v_cache, k_scale, v_scale, req_to_token, req_pool_indices,
            shared_prefix.lens,
            shared_prefix.group_start, shared_prefix.group_end, mid_o, mid_lse,
            scale * _LOG2E, *strides, num_kv_splits,
            GROUP=group,
            BLOCK_R=block_r,
            BLOCK_M=block_m,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            **dot_options(q),
            KV_INT8=kv_int8,
            num_warps=shared_prefix_warps(block_m, block_d),
            num_stages=2,
        )
    _decode_merge_kernel[(bs, num_heads)](
        mid_o, mid_lse, seq_lens, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        NUM_SPLITS=total_splits,
        BLOCK_S=triton.next_power_of_2(total_splits),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        FILLED=filled,
        num_warps=4 if block_d >= 128 else 2,
    )
    return out


def warm_up_decode_attention(k_cache: torch.Tensor, v_cache: torch.Tensor,
                             req_to_token: torch.Tensor, *, num_heads: int, scale: float,
                             num_kv_splits: int | None = None,
                             windowed: bool = False, q_dtype: torch.dtype | None = None) -> int:
    """Launch once each variant of `decode_variants` over these pools, so triton compiles them
    all now (`windowed`: each split count with a sliding window too); the count launched.
    q_dtype: the queries' (default the pool's; an int8 pool's are the model's).
    Tensors alike in dtype and layout to a serving backend's (int64 lengths and rows, queries
    of the pool's dtype), so its launches find the variants compiled. Reads slot ids of the
    table's row 0, writes only its own outputs."""
    device = k_cache.device
    num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    bs = 2
    q = torch.zeros((bs, num_heads, head_dim), dtype=q_dtype or k_cache.dtype, device=device)
    rows = torch.zeros(bs, dtype=torch.int64, device=device)
    ones = torch.ones(bs, dtype=torch.int64, device=device)
    together = SharedPrefix(ones, torch.zeros_like(rows), torch.full_like(rows, bs))
    variants = decode_variants(device, num_heads, num_kv_heads, num_kv_splits)
    launches = [(splits, shared, None) for splits, shared in variants]
    if windowed:  # (any window: it is not specialised on)
        launches += [(splits, False, 1) for splits in dict.fromkeys(n for n, _ in variants)]
    for splits, shared, w in launches:
        decode_attention_triton(q, k_cache, v_cache, req_to_token, rows, ones, scale=scale,
                                num_kv_splits=splits, max_seq_len=1,
                                shared_prefix=together if shared else None, window=w)
    return len(launches)
