"""Triton decode attention over the token-slot table, split-KV (flash-decoding).

Stage 1: program (request, head block, split) reads one slice of the request's context through
req_to_token and attends with all query heads that share the KV head (GQA: the K/V tile is
loaded once per group), writing a partial output and its log-sum-exp. Stage 2: program
(request, head) merges the splits. Semantics: kernels/attention.py.

Split boundaries, shared by both stages: split_len = cdiv(cdiv(seq_len, num_splits), BLOCK_N)
* BLOCK_N; split s covers [s * split_len, min((s + 1) * split_len, seq_len)), possibly empty.

Shared prefixes (FlashInfer's cascade): requests of the batch whose slot rows begin with the
same `min_shared_prefix` or more slots (the radix cache gives a shared prompt prefix the same
slots) attend over that prefix together. `plan_shared_prefix` finds them on the device, without
a host sync: each request's row against the previous request's, consecutive requests that share
enough forming a group, whose prefix is the shortest of those runs. Stage 1 then covers only
each request's keys after its group's prefix (from the prefix rounded down to BLOCK_N, split as
above, the prefix's keys in its first tile masked), and a third
kernel, program (first request of a block of members, KV head, split), takes up to BLOCK_R
members x the query heads of the KV head as the rows of one tl.dot against each tile of prefix
keys, then values (each key tile loaded once for all of them), writing its partials after stage
1's; stage 2 merges both by log-sum-exp. The prefix splits the same way over [0, prefix).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import dot, dot_options

_LOG2E = 1.0 / math.log(2.0)
MAX_KV_SPLITS = 64
MIN_SPLIT_LEN = 256  # tokens: shorter splits cost more in the merge than they win
PROGRAMS_PER_SM = 8  # enough resident programs per SM to keep loads in flight
MAX_HEADS_PER_PROGRAM = 64
MIN_SHARED_PREFIX = 64  # shared prefixes shorter than this attend per request
SHARED_ROWS = 64  # query rows (members x query heads of a KV head) per prefix program


@triton.jit
def _decode_split_kernel(
    Q, K_cache, V_cache, Req_to_token, Req_pool_indices, Seq_lens, Mid_o, Mid_lse,
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_req,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
    Shared_lens,  # [bs]: keys before the request's own (a shared prefix's), or unused
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
):
    req = tl.program_id(0)
    head_block = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    seq_len = tl.load(Seq_lens + req).to(tl.int32)
    first = 0  # the first key of its own; tiles stay aligned to BLOCK_N, its prefix masked
    if SHARED:
        first = tl.load(Shared_lens + req).to(tl.int32)
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
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale  # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        v = tl.load(V_cache + (slots[:, None] * stride_vc_s + offs_d[None, :]),
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
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
def _shared_prefix_kernel(
    Q, K_cache, V_cache, Req_to_token, Req_pool_indices, Shared_lens, Group_start, Group_end,
    Mid_o, Mid_lse,
    qk_scale,  # softmax scale * log2(e)
    stride_q_b, stride_q_h, stride_kc_s, stride_kc_h, stride_vc_s, stride_vc_h, stride_req,
    stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
    FIRST_SPLIT,  # where its splits go in Mid_o / Mid_lse: after stage 1's
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_R: tl.constexpr,  # requests per program
    BLOCK_M: tl.constexpr,  # BLOCK_R * GROUP padded to a power of two >= 16 (tl.dot)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
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
        qk = dot(q, k, PRECISION, UPCAST) * qk_scale  # [BLOCK_M, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        v = tl.load(V_cache + (slots[:, None] * stride_vc_s + offs_d[None, :]),
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
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


@dataclass
class SharedPrefix:
    """Which requests of a decode batch attend over a shared prefix together (`plan_shared_prefix`):
    int64 device tensors [bs]."""

    lens: torch.Tensor  # its group's shared prefix, in keys; 0: it attends alone
    group_start: torch.Tensor  # its group's first request (batch index)
    group_end: torch.Tensor  # one past its group's last


def plan_shared_prefix(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                       seq_lens: torch.Tensor, *, max_seq_len: int | None = None,
                       min_shared_prefix: int = MIN_SHARED_PREFIX) -> SharedPrefix | None:
    """Groups of consecutive requests whose slot rows begin alike, with torch ops on the
    device (no host sync): request r + 1 joins request r's group when their rows share at least
    `min_shared_prefix` leading slots; a group's prefix is the shortest such run in it. None
    when no group can form (a single request, sharing off, rows too short). Compute it once per
    forward and pass it to every layer's `decode_attention_triton`."""
    bs = req_pool_indices.numel()
    width = req_to_token.shape[1] if max_seq_len is None else min(max_seq_len,
                                                                   req_to_token.shape[1])
    if bs < 2 or min_shared_prefix <= 0 or width < min_shared_prefix:
        return None
    device = req_to_token.device
    rows = req_to_token[req_pool_indices.long(), :width]  # [bs, width]
    lens = seq_lens.to(torch.int64)
    limit = torch.minimum(lens[1:], lens[:-1])
    pos = torch.arange(width, device=device)
    same = (rows[1:] == rows[:-1]) & (pos[None, :] < limit[:, None])
    common = same.to(torch.int32).cumprod(1).sum(1)  # [bs - 1]: r + 1's run alike with r
    link = common >= min_shared_prefix
    idx = torch.arange(bs, device=device)
    starts = torch.ones(bs, dtype=torch.bool, device=device)
    starts[1:] = ~link
    group = starts.to(torch.int64).cumsum(0) - 1
    none = torch.iinfo(torch.int64).max
    shortest = torch.full((bs,), none, dtype=torch.int64, device=device).scatter_reduce(
        0, group[1:], torch.where(link, common.to(torch.int64), none), "amin")[group]
    last = torch.zeros(bs, dtype=torch.int64, device=device).scatter_reduce(
        0, group, idx, "amax")[group]
    return SharedPrefix(torch.where(shortest == none, 0, shortest),
                        torch.where(starts, idx, 0).cummax(0).values, last + 1)


def decode_attention_triton(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, *,
                            scale: float, num_kv_splits: int | None = None,
                            max_seq_len: int | None = None,
                            shared_prefix: SharedPrefix | None | str = "auto",
                            min_shared_prefix: int = MIN_SHARED_PREFIX) -> torch.Tensor:
    """shared_prefix: a `plan_shared_prefix` plan, "auto" (plan here, with
    min_shared_prefix), or None (every request attends alone)."""
    if q.stride(-1) != 1:
        q = q.contiguous()
    bs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    out = torch.empty_like(q)
    if bs == 0:
        return out
    group = num_heads // num_kv_heads
    heads_per_program = min(group, MAX_HEADS_PER_PROGRAM)
    head_blocks_per_kv = triton.cdiv(group, heads_per_program)
    if num_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max())
        num_kv_splits = choose_num_kv_splits(q, bs * num_kv_heads * head_blocks_per_kv,
                                             max_seq_len)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")
    if isinstance(shared_prefix, str):
        if shared_prefix != "auto":
            raise ValueError(f"shared_prefix must be a plan, 'auto' or None, not {shared_prefix!r}")
        shared_prefix = None if group > SHARED_ROWS else plan_shared_prefix(
            req_to_token, req_pool_indices, seq_lens, max_seq_len=max_seq_len,
            min_shared_prefix=min_shared_prefix)
    shared = shared_prefix is not None and group <= SHARED_ROWS
    block_d = triton.next_power_of_2(head_dim)
    block_n = 64 if q.is_cuda else 32
    total_splits = 2 * num_kv_splits if shared else num_kv_splits  # then: own keys', prefix's
    mid_o = torch.empty((bs, num_heads, total_splits, head_dim), dtype=torch.float32,
                        device=q.device)
    if shared:  # a split no program writes (empty) stays -inf
        mid_lse = torch.full((bs, num_heads, total_splits), float("-inf"), dtype=torch.float32,
                             device=q.device)
    else:
        mid_lse = torch.empty((bs, num_heads, total_splits), dtype=torch.float32,
                              device=q.device)
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
               v_cache.stride(0), v_cache.stride(1), req_to_token.stride(0),
               mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0),
               mid_lse.stride(1))

    _decode_split_kernel[(bs, num_kv_heads * head_blocks_per_kv, num_kv_splits)](
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        scale * _LOG2E, *strides,
        shared_prefix.lens if shared else seq_lens,
        GROUP=group,
        HEADS_PER_PROGRAM=heads_per_program,
        HEAD_BLOCKS_PER_KV=head_blocks_per_kv,
        BLOCK_H=max(16, triton.next_power_of_2(heads_per_program)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        **dot_options(q),
        SHARED=shared,
        num_warps=4,
        num_stages=2,
    )
    if shared:
        block_r = max(1, SHARED_ROWS // group)
        block_m = max(16, triton.next_power_of_2(block_r * group))
        _shared_prefix_kernel[(bs, num_kv_heads, num_kv_splits)](
            q, k_cache, v_cache, req_to_token, req_pool_indices, shared_prefix.lens,
            shared_prefix.group_start, shared_prefix.group_end, mid_o, mid_lse,
            scale * _LOG2E, *strides, num_kv_splits,
            GROUP=group,
            BLOCK_R=block_r,
            BLOCK_M=block_m,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            **dot_options(q),
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
        FILLED=shared,
        num_warps=4 if block_d >= 128 else 2,
    )
    return out


def shared_prefix_warps(block_m: int, block_d: int) -> int:
    """Warps of a shared-prefix program: 8 from a 64 x 128 accumulator on (at 4, sm_90's ptxas
    spills registers there: bench/kernel_registers.py)."""
    return 8 if block_m * block_d >= 64 * 128 else 4


def choose_num_kv_splits(q: torch.Tensor, programs_per_split: int, max_seq_len: int) -> int:
    """Enough splits to fill the GPU, none shorter than MIN_SPLIT_LEN tokens."""
    if not q.is_cuda:
        return 1 if max_seq_len <= 64 else 2
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, programs_per_split)
    by_length = max(1, max_seq_len // MIN_SPLIT_LEN)
    return max(1, min(wanted, by_length, MAX_KV_SPLITS))
