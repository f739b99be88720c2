"""Grouped experts: the torch reference against a dense loop over every (token, expert) pair,
and the Triton kernels (on the GPU, or the CPU under TRITON_INTERPRET=1: the `kernel_device`
fixture) against the reference.

Tolerances: fp32 atol 1e-4 / rtol 1e-4 for the kernels (1e-5 for the reference against the
loop); bf16 atol 2e-2 / rtol 2e-2: the reference rounds to bf16 after each step and sums in
bf16, the kernels round gate/up, h and y once each and sum in fp32; and triton's interpreter
truncates fp32 -> bf16 casts where a GPU rounds to nearest (about twice the error).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixflow.kernels.moe import moe_experts, moe_experts_torch

TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def make_moe(num_tokens, hidden, inter, num_experts, top_k, dtype=torch.float32, *, seed=0,
             experts=None, ids_dtype=torch.int64, device="cpu"):
    """x, w_gate_up, w_down and a router's top_k choice (distinct experts per token, softmax
    weights in fp32) over `experts` (default: all of them). Made on the CPU, moved to device."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g)
    w_gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    w_down = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    scores = torch.randn(num_tokens, num_experts, generator=g)
    if experts is not None:
        allowed = torch.zeros(num_experts, dtype=torch.bool)
        allowed[experts] = True
        scores = scores.masked_fill(~allowed, float("-inf"))
    topk_scores, topk_ids = scores.topk(top_k, dim=-1)
    topk_weights = topk_scores.softmax(dim=-1)
    return (x.to(dtype).to(device), w_gate_up.to(dtype).to(device), w_down.to(dtype).to(device),
            topk_ids.to(ids_dtype).to(device), topk_weights.to(device))


def dense_loop(x, w_gate_up, w_down, topk_ids, topk_weights):
    """Every token, every chosen expert, one at a time."""
    inter = w_down.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gate_up = w_gate_up[e].float() @ x[t].float()
            h = F.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += float(topk_weights[t, j]) * (w_down[e].float() @ h)
    return out


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(9, 8, 1), (7, 8, 2), (5, 8, 8),
                                                           (1, 4, 2)])
def test_reference_matches_dense_loop(num_tokens, num_experts, top_k):
    args = make_moe(num_tokens, 32, 16, num_experts, top_k, seed=top_k)
    got = moe_experts_torch(*args)
    assert got.shape == (num_tokens, 32) and got.dtype == torch.float32
    torch.testing.assert_close(got, dense_loop(*args), atol=1e-5, rtol=1e-5)
    assert torch.equal(moe_experts(*args), got)  # "auto" on a CPU tensor is the reference


def test_reference_reads_only_routed_experts():
    # experts 0, 2, 4, 5 get no tokens; NaN weights there would poison any product with them
    x, w_gate_up, w_down, ids, weights = make_moe(6, 32, 16, 6, 2, experts=[1, 3])
    want = dense_loop(x, w_gate_up, w_down, ids, weights)
    for e in (0, 2, 4, 5):
        w_gate_up[e] = float("nan")
        w_down[e] = float("nan")
    got = moe_experts_torch(x, w_gate_up, w_down, ids.int(), weights)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_reference_bf16_keeps_dtype():
    args = make_moe(5, 32, 16, 4, 2, torch.bfloat16, seed=3)
    got = moe_experts_torch(*args)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), dense_loop(*args), **TOL[torch.bfloat16])


def test_align_pairs_by_expert():
    from radixflow.kernels.triton.moe import align_pairs_by_expert

    num_experts, block_m = 5, 4
    ids = torch.tensor([[0, 3], [3, 0], [3, 1], [3, 0], [3, 1], [0, 3]])  # no pairs for 2, 4
    num_pairs = ids.numel()
    sorted_pairs, block_experts = align_pairs_by_expert(ids, num_experts, block_m)
    blocks = sorted_pairs.view(-1, block_m).tolist()
    # expert 0: 4 pairs (1 block), 1: 2 (1 block), 3: 6 (2 blocks); then all-padding blocks
    # up to the host-side bound (it cannot know that experts 2 and 4 have no pairs)
    assert block_experts.tolist()[:4] == [0, 1, 3, 3]
    assert block_experts.tolist()[4:] == [num_experts] * (len(blocks) - 4)
    assert blocks[0] == [0, 3, 7, 10]
    assert blocks[1] == [5, 9, num_pairs, num_pairs]
    assert blocks[2] == [1, 2, 4, 6] and blocks[3] == [8, 11, num_pairs, num_pairs]
    assert all(block == [num_pairs] * block_m for block in blocks[4:])
    flat = ids.reshape(-1)
    for block, expert in zip(blocks, block_experts.tolist()):
        assert all(flat[p] == expert for p in block if p < num_pairs)


def test_bad_inputs_raise():
    x, w_gate_up, w_down, ids, weights = make_moe(3, 32, 16, 4, 2)
    cases = [
        ((x[:, :16], w_gate_up, w_down, ids, weights), "hidden"),
        ((x, w_gate_up, w_down[:, :, :8], ids, weights), "w_down shape"),
        ((x, w_gate_up[:, :31], w_down, ids, weights), "2 \\* inter"),
        ((x, w_gate_up, w_down, ids[:2], weights[:2]), "num_tokens"),
        ((x, w_gate_up, w_down, ids, weights[:, :1]), "topk_weights shape"),
        ((x, w_gate_up, w_down, ids.float(), weights), "int32 or int64"),
        ((x, w_gate_up.double(), w_down, ids, weights), "dtype"),
        ((x, w_gate_up[:1], w_down[:1], ids.clamp(max=0), weights), "top_k 2 > num_experts 1"),
        ((x, w_gate_up, w_down, ids + 3, weights), "out of range"),
        ((x, w_gate_up, w_down, ids - 1, weights), "out of range"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            moe_experts(*args)
        with pytest.raises(ValueError, match=message):
            moe_experts_torch(*args)
    with pytest.raises(ValueError, match="backend"):
        moe_experts(x, w_gate_up, w_down, ids, weights, backend="cuda")


# top_k 1, 2 and 8; a single token; int32 ids; bf16 with bf16 routing weights; token counts
# that leave every expert's last block part padding
@pytest.mark.parametrize("num_tokens,hidden,inter,num_experts,top_k,dtype,ids_dtype", [
    (9, 64, 32, 8, 2, torch.float32, torch.int64),
    (5, 32, 16, 8, 8, torch.float32, torch.int32),
    (7, 48, 24, 4, 1, torch.float32, torch.int64),
    (1, 32, 16, 4, 2, torch.float32, torch.int32),
    (9, 64, 32, 6, 2, torch.bfloat16, torch.int64),
])
def test_kernel_matches_reference(num_tokens, hidden, inter, num_experts, top_k, dtype,
                                  ids_dtype, kernel_device):
    x, w_gate_up, w_down, ids, weights = make_moe(num_tokens, hidden, inter, num_experts,
                                                  top_k, dtype, seed=num_tokens,
                                                  ids_dtype=ids_dtype, device=kernel_device)
    if dtype == torch.bfloat16:
        weights = weights.to(dtype)
    want = moe_experts(x, w_gate_up, w_down, ids, weights, backend="torch")
    got = moe_experts(x, w_gate_up, w_down, ids, weights, backend="triton")
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_skips_unrouted_experts(dtype, kernel_device):
    # experts 0, 2, 4 get no tokens, and NaN weights there must not reach the output
    x, w_gate_up, w_down, ids, weights = make_moe(7, 32, 16, 5, 2, dtype, seed=5,
                                                  experts=[1, 3], device=kernel_device)
    want = moe_experts(x, w_gate_up, w_down, ids, weights, backend="torch")
    for e in (0, 2, 4):
        w_gate_up[e] = float("nan")
        w_down[e] = float("nan")
    got = moe_experts(x, w_gate_up, w_down, ids, weights, backend="triton")
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def test_kernel_expert_spanning_blocks_and_strided_input(kernel_device):
    # every token picks expert 2 twice (the sum counts both) and expert 0 once: expert 2 gets
    # 18 pairs, more than one block of 16; x is a column slice of a wider tensor
    x, w_gate_up, w_down, _, _ = make_moe(9, 32, 16, 4, 3, seed=7, device=kernel_device)
    x = torch.cat([x, torch.randn_like(x)], dim=1)[:, :32]
    ids = torch.tensor([[2, 0, 2]] * 9, device=kernel_device)
    weights = torch.rand(9, 3, generator=torch.Generator().manual_seed(1)).to(kernel_device)
    want = moe_experts(x, w_gate_up, w_down, ids, weights, backend="torch")
    torch.testing.assert_close(want.cpu(), dense_loop(x.cpu(), w_gate_up.cpu(), w_down.cpu(),
                                                      ids.cpu(), weights.cpu()),
                               atol=1e-5, rtol=1e-5)
    got = moe_experts(x, w_gate_up, w_down, ids, weights, backend="triton")
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_kernel_no_tokens(kernel_device):
    x, w_gate_up, w_down, ids, weights = make_moe(0, 32, 16, 4, 2, device=kernel_device)
    got = moe_experts(x, w_gate_up, w_down, ids, weights, backend="triton")
    assert got.shape == (0, 32)


def test_kernel_int64_offsets(monkeypatch, kernel_device):
    # tensors past 2**31 elements switch to 64-bit row offsets; too big to allocate, so force it
    monkeypatch.setattr("radixflow.kernels.triton.moe.needs_int64", lambda *_: True)
    args = make_moe(6, 32, 16, 4, 2, seed=11, device=kernel_device)
    want = moe_experts(*args, backend="torch")
    torch.testing.assert_close(moe_experts(*args, backend="triton"), want, **TOL[torch.float32])


def test_kernel_random_shapes(kernel_device):
    g = torch.Generator().manual_seed(123)
    for seed in range(6):
        num_experts = int(torch.randint(1, 9, (1,), generator=g))
        top_k = int(torch.randint(1, num_experts + 1, (1,), generator=g))
        used = torch.randperm(num_experts, generator=g)[:max(top_k, num_experts // 2)].tolist()
        num_tokens = int(torch.randint(1, 10, (1,), generator=g))
        hidden = (32, 48, 64)[seed % 3]
        args = make_moe(num_tokens, hidden, hidden // 2, num_experts, top_k, seed=seed,
                        experts=used, device=kernel_device)
        want = moe_experts(*args, backend="torch")
        torch.testing.assert_close(moe_experts(*args, backend="triton"), want,
                                   **TOL[torch.float32])
