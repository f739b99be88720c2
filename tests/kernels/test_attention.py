"""Triton extend / decode attention (on the GPU, or the CPU under TRITON_INTERPRET=1: the
`kernel_device` fixture) against the torch references, and the references against dense
attention written out by hand.

Tolerances: fp32 atol 1e-4 / rtol 1e-4; bf16 atol 2e-2 / rtol 2e-2 (the kernels round P to
bf16 before the PV product; the reference works in fp32 throughout).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.paged_attention import TOL, make_paged, make_shared, run_extend

from radixflow.kernels.attention import (
    decode_attention,
    decode_attention_torch,
    extend_attention_torch,
)


def dense_attention(q, keys, values, scale):
    """Causal softmax(q k^T) v of one request whose queries are its last len(q) positions."""
    num_q, num_k = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for h in range(q.shape[1]):
        kh, vh = keys[:, h // group].double(), values[:, h // group].double()
        for i in range(num_q):
            s = (kh @ q[i, h].double()) * scale
            s[num_k - num_q + i + 1:] = float("-inf")
            out[i, h] = torch.softmax(s, 0) @ vh
    return out


def test_references_match_dense_attention():
    case = make_paged([0, 3, 5], [4, 1, 2], 4, 2, 8, torch.float32)
    scale = 0.3
    got = extend_attention_torch(*(case[k] for k in (
        "q", "k", "v", "k_cache", "v_cache", "req_to_token", "req_pool_indices", "prefix_lens",
        "extend_lens", "extend_starts")), scale=scale)
    start = 0
    for row, p, e in zip(case["req_pool_indices"].tolist(), [0, 3, 5], [4, 1, 2]):
        slots = case["req_to_token"][row, :p + e].long()
        want = dense_attention(case["q"][start:start + e], case["k_cache"][slots],
                               case["v_cache"][slots], scale)
        torch.testing.assert_close(got[start:start + e].double(), want, atol=1e-5, rtol=1e-5)
        start += e
    q = torch.randn(3, 4, 8)
    got = decode_attention_torch(q, case["k_cache"], case["v_cache"], case["req_to_token"],
                                 case["req_pool_indices"], case["seq_lens"], scale=scale)
    for i, (row, n) in enumerate(zip(case["req_pool_indices"].tolist(), [4, 4, 7])):
        slots = case["req_to_token"][row, :n].long()
        want = dense_attention(q[i:i + 1], case["k_cache"][slots], case["v_cache"][slots], scale)
        torch.testing.assert_close(got[i:i + 1].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,dtype",
    [(4, 4, 64, torch.float32), (8, 2, 128, torch.float32), (4, 1, 64, torch.bfloat16)],
)
def test_extend_kernel_matches_reference(num_heads, num_kv_heads, head_dim, dtype,
                                         kernel_device):
    # empty and non-empty prefixes; extends of 1, exactly one tile, and spanning tiles
    prefix_lens, extend_lens = [0, 7, 33, 0, 64], [1, 40, 5, 32, 3]
    case = make_paged(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype,
                      device=kernel_device)
    scale = 1 / math.sqrt(head_dim)
    want = run_extend(case, "torch", scale)
    got = run_extend(case, "triton", scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def test_extend_kernel_int64_offsets(monkeypatch, kernel_device):
    # pools past 2**31 elements switch to 64-bit offsets; too big to allocate here, so force it
    monkeypatch.setattr("radixflow.kernels.triton.extend_attention.needs_int64", lambda *_: True)
    case = make_paged([0, 5], [3, 4], 4, 2, 64, torch.float32, seed=3, device=kernel_device)
    want = run_extend(case, "torch", 0.125)
    torch.testing.assert_close(run_extend(case, "triton", 0.125), want, **TOL[torch.float32])


def test_extend_kernel_lengths_one_to_n(kernel_device):
    n = 9
    prefix_lens, extend_lens = list(range(n)), list(range(1, n + 1))
    case = make_paged(prefix_lens, extend_lens, 2, 1, 64, torch.float32, seed=1,
                      device=kernel_device)
    want = run_extend(case, "torch", 0.125)
    torch.testing.assert_close(run_extend(case, "triton", 0.125), want, **TOL[torch.float32])


# 1 split; 3 (uneven); 8: more splits than the short requests have tiles (empty splits)
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,dtype,num_kv_splits",
    [(4, 4, 64, torch.float32, 8), (8, 1, 128, torch.float32, 1),
     (8, 2, 64, torch.bfloat16, 3)],
)
def test_decode_kernel_matches_reference(num_heads, num_kv_heads, head_dim, dtype,
                                         num_kv_splits, kernel_device):
    seq_lens = [1, 2, 31, 64, 97]
    case = make_paged([s - 1 for s in seq_lens], [1] * len(seq_lens), num_heads, num_kv_heads,
                      head_dim, dtype, seed=2, device=kernel_device)
    args = (case["q"], case["k_cache"], case["v_cache"], case["req_to_token"],
            case["req_pool_indices"], case["seq_lens"])
    scale = 1 / math.sqrt(head_dim)
    want = decode_attention(*args, scale=scale, backend="torch")
    got = decode_attention(*args, scale=scale, num_kv_splits=num_kv_splits, backend="triton")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def test_decode_kernel_empty_sequence_gives_zeros(kernel_device):
    case = make_paged([4, 0], [1, 1], 2, 1, 64, torch.float32, device=kernel_device)
    seq_lens = torch.tensor([5, 0], device=kernel_device)
    got = decode_attention(case["q"], case["k_cache"], case["v_cache"], case["req_to_token"],
                           case["req_pool_indices"], seq_lens, scale=0.1, num_kv_splits=2,
                           backend="triton")
    want = decode_attention(case["q"], case["k_cache"], case["v_cache"], case["req_to_token"],
                            case["req_pool_indices"], seq_lens, scale=0.1, backend="torch")
    assert torch.equal(got[1], torch.zeros_like(got[1]))
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_bad_head_counts_and_backend_raise():
    case = make_paged([1], [1], 3, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        run_extend(case, "torch", 1.0)
    case = make_paged([1], [1], 2, 2, 64, torch.float32)
    with pytest.raises(ValueError, match="backend"):
        run_extend(case, "cuda", 1.0)


def test_shared_prefix_plan_groups_consecutive_requests(kernel_device):
    from radixflow.kernels.triton.decode_plan import plan_shared_prefix

    # in batch order: 3 sharing 100 slots (the third only 80 of them), a lone request, 2
    # sharing 70 (one with no keys of its own), 2 sharing 20 (fewer than 64: alone)
    _, _, _, table, rows, lens = make_shared(
        [(100, [5, 1, 3]), (0, [90]), (70, [9, 0]), (20, [3, 4])],
        num_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32, device=kernel_device)
    table[rows[2], 80:100] = torch.arange(900, 920, dtype=torch.int32, device=kernel_device)
    plan = plan_shared_prefix(table, rows, lens)
    assert plan.lens.tolist() == [80, 80, 80, 0, 70, 70, 0, 0]
    assert plan.group_start.tolist() == [0, 0, 0, 3, 4, 4, 6, 7]
    assert plan.group_end.tolist() == [3, 3, 3, 4, 6, 6, 7, 8]
    lower = plan_shared_prefix(table, rows, lens, min_shared_prefix=16)
    assert lower.lens.tolist()[-2:] == [20, 20]
    assert plan_shared_prefix(table, rows[:1], lens[:1]) is None
    assert plan_shared_prefix(table, rows, lens, min_shared_prefix=0) is None


# GQA 4:1 fp32 with two splits; a non-power-of-two group (3) in bf16; 10 members sharing with
# 8 query heads per KV head (more than one program's block of 8 members) and uneven splits
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,dtype,splits,groups", [
    (8, 2, 32, torch.float32, 2, [(70, [3, 1, 40]), (0, [5]), (66, [2, 0])]),
    (6, 2, 16, torch.bfloat16, 1, [(0, [7]), (90, [1, 2, 3, 4])]),
    (16, 2, 16, torch.float32, 3, [(65, [1, 2, 3, 4, 5, 6, 7, 8, 9, 1])]),
])
def test_decode_kernel_over_shared_prefixes_matches_reference(num_heads, num_kv_heads, head_dim,
                                                              dtype, splits, groups,
                                                              kernel_device):
    from radixflow.kernels.triton.decode_attention import decode_attention_triton

    args = make_shared(groups, num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_dim=head_dim, dtype=dtype, device=kernel_device)
    scale = 1 / math.sqrt(head_dim)
    want = decode_attention(*args, scale=scale, backend="torch")
    got = decode_attention(*args, scale=scale, num_kv_splits=splits, backend="triton")
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    alone = decode_attention_triton(*args, scale=scale, num_kv_splits=splits,
                                    shared_prefix=None)
    torch.testing.assert_close(got.float(), alone.float(), **TOL[dtype])
