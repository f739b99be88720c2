"""Triton decode attention's cascade kernel: the requests of a group that share a prefix of
KV slots attend over that prefix together (FlashInfer's cascade; the launcher and the
stage-1 / merge kernels: decode_attention.py, the groups: decode_plan.plan_shared_prefix).

Program (first request of a block of members, KV head, split) takes up to BLOCK_R members x the
query heads of the KV head as the rows of one tl.dot against each tile of prefix keys, then
values (each key tile loaded once for all of them), writing its partials after stage 1's;
stage 2 merges both by log-sum-exp. The prefix splits like a request's context does, over
[0, prefix).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import dequantize_keys, dequantize_values, dot


@triton.jit
def _shared_prefix_kernel(
    Q, K_cache, V_cache, K_scale, V_scale, Req_to_token, Req_pool_indices, Shared_lens,
    Group_start, Group_end, Mid_o, Mid_lse,
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_req,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h, stride_ks_s, stride_vs_s,
    FIRST_SPLIT,  # where its splits go in Mid_o / Mid_lse: after stage 1's
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_R: tl.constexpr,  # requests per program
    BLOCK_M: tl.constexpr,  # BLOCK_R * GROUP padded to a power of two >= 16 (tl.dot)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    KV_INT8: tl.constexpr,  # int8 codes, times K_scale / V_scale [slots, kv_heads] (fp16)
):
    req = tl.program_id(0)  # a block's first member, or a program with nothing to do
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    prefix_len = tl.load(Shared_lens + req).to(tl.int32)
    group_start = tl.load(Group_start + req).to(tl.int32)
    group_end = tl.load(Group_end + req).to(tl.int32)
    if prefix_len == 0 or (req - group_start) % BLOCK_R != 0:
        return
    split_len = tl.cdiv(tl.cdiv(prefix_len, num_splits), BLOCK_N) * BLOCK_N
    split_start = split * split_len
    split_end = tl.minimum(split_start + split_len, prefix_len)
    if split_start >= split_end:
        return

    offs_m = tl.arange(0, BLOCK_M)  # row m: member req + m // GROUP, its head m % GROUP
    members = req + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    mask_m = (offs_m < BLOCK_R * GROUP) & (members < group_end)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_n = tl.arange(0, BLOCK_N)
    req_row = tl.load(Req_pool_indices + req).to(tl.int64)  # the prefix: every member's alike
    K_cache += kv_head * stride_kc_h
    V_cache += kv_head * stride_vc_h
    K_scale += kv_head
    V_scale += kv_head
    members = members.to(tl.int64)

    q = tl.load(Q + members[:, None] * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(split_start, split_end, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < split_end
        slots = tl.load(Req_to_token + req_row * stride_req + cols, mask=mask_n, other=0)
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
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, PRECISION, UPCAST)
        m_i = m_new

    at = FIRST_SPLIT + split
    tl.store(Mid_o + members[:, None] * stride_mo_b + heads[:, None] * stride_mo_h
             + at * stride_mo_s + offs_d[None, :], acc / l_i[:, None],
             mask=mask_m[:, None] & mask_d[None, :])
    tl.store(Mid_lse + members * stride_ml_b + heads * stride_ml_h + at, m_i + tl.log2(l_i),
             mask=mask_m)
