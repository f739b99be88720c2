"""Sliding-window attention (kernels/attention.py's `window`: the query at position p sees the
keys at p - window < k <= p, transformers' sliding_window_causal_mask_function): the torch
references against dense attention written out by hand, and the Triton extend and decode
kernels (on the GPU, or the CPU under the interpreter) against the references, with windows
smaller than the prefix, equal to it, and larger than the whole context."""

from __future__ import annotations

import pytest
import torch
from helpers.paged_attention import TOL, make_paged, make_shared, run_extend

from radixflow.kernels.attention import (
    attend,
    decode_attention,
    decode_attention_torch,
    extend_attention_torch,
)

EXTEND_KEYS = ("q", "k", "v", "k_cache", "v_cache", "req_to_token", "req_pool_indices",
               "prefix_lens", "extend_lens", "extend_starts")


def dense_windowed(q, keys, values, scale, window):
    """softmax(q k^T) v of one request whose queries are its last len(q) positions, each
    seeing the keys within `window` positions of it (itself included), in float64."""
    num_q, num_k = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for h in range(q.shape[1]):
        kh, vh = keys[:, h // group].double(), values[:, h // group].double()
        for i in range(num_q):
            p = num_k - num_q + i  # the query's position
            s = (kh @ q[i, h].double()) * scale
            for kpos in range(num_k):
                if not p - window < kpos <= p:
                    s[kpos] = float("-inf")
            out[i, h] = torch.softmax(s, 0) @ vh
    return out


def test_window_convention_is_transformers():
    """The mask is transformers' own: and_masks(sliding_window_overlay, causal)."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    window, n = 3, 7
    fn = masking_utils.sliding_window_causal_mask_function(window)
    theirs = torch.tensor([[bool(fn(0, 0, torch.tensor(i), torch.tensor(j))) for j in range(n)]
                           for i in range(n)])
    # attend() with one-hot values: row i's output is the distribution over its visible keys
    q = torch.zeros(n, 1, 4)
    keys = torch.zeros(n, 1, 4)
    values = torch.eye(n)[:, None, :].expand(n, 1, n).contiguous()
    probs = attend(q, keys, values, scale=1.0, first_pos=0, window=window)[:, 0]
    assert torch.equal(probs > 0, theirs)


@pytest.mark.parametrize("window", [1, 3, 5, 100])
def test_references_match_dense_windowed_attention(window):
    prefix_lens, extend_lens = [0, 3, 5, 9], [4, 1, 2, 6]
    case = make_paged(prefix_lens, extend_lens, 4, 2, 8, torch.float32)
    scale = 0.3
    got = extend_attention_torch(*(case[k] for k in EXTEND_KEYS), scale=scale, window=window)
    start = 0
    for row, p, e in zip(case["req_pool_indices"].tolist(), prefix_lens, extend_lens):
        slots = case["req_to_token"][row, :p + e].long()
        want = dense_windowed(case["q"][start:start + e], case["k_cache"][slots],
                              case["v_cache"][slots], scale, window)
        torch.testing.assert_close(got[start:start + e].double(), want, atol=1e-5, rtol=1e-5)
        start += e
    q = torch.randn(4, 4, 8)
    got = decode_attention_torch(q, case["k_cache"], case["v_cache"], case["req_to_token"],
                                 case["req_pool_indices"], case["seq_lens"], scale=scale,
                                 window=window)
    for i, (row, n) in enumerate(zip(case["req_pool_indices"].tolist(),
                                     case["seq_lens"].tolist())):
        slots = case["req_to_token"][row, :n].long()
        want = dense_windowed(q[i:i + 1], case["k_cache"][slots], case["v_cache"][slots], scale,
                              window)
        torch.testing.assert_close(got[i:i + 1].double(), want, atol=1e-5, rtol=1e-5)


def test_a_window_past_the_context_is_no_window():
    case = make_paged([3, 0], [5, 4], 2, 1, 8, torch.float32, seed=4)
    args = [case[k] for k in EXTEND_KEYS]
    torch.testing.assert_close(extend_attention_torch(*args, scale=0.2, window=8),
                               extend_attention_torch(*args, scale=0.2))
    with pytest.raises(ValueError, match="window"):
        run_extend_window(case, "torch", 0.2, 0)


def run_extend_window(case, backend, scale, window):
    from radixflow.kernels.attention import extend_attention

    return extend_attention(*(case[k] for k in EXTEND_KEYS), scale=scale, window=window,
                            backend=backend)


# prefixes of 0 / 20 / 40 / 70 keys (past one and two 32-key tiles), extends within a tile,
# spanning tiles, and a single token; windows of 1, below a tile, of a tile, the prefix's
# size (40), and past every context
@pytest.mark.parametrize("window", [1, 7, 32, 40, 500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_kernel_window_matches_reference(window, dtype, kernel_device):
    prefix_lens, extend_lens = [0, 20, 40, 70, 40], [45, 9, 1, 37, 40]
    case = make_paged(prefix_lens, extend_lens, 4, 2, 32, dtype, seed=window,
                      device=kernel_device)
    want = run_extend_window(case, "torch", 0.2, window)
    got = run_extend_window(case, "triton", 0.2, window)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])
    if window == 500:  # a window past every context: as without one
        torch.testing.assert_close(got, run_extend(case, "triton", 0.2), **TOL[dtype])


@pytest.mark.parametrize("window", [1, 5, 32, 40, 65, 500])
@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_decode_kernel_window_matches_reference(window, num_kv_splits, kernel_device):
    seq_lens = [1, 2, 31, 40, 64, 97]
    case = make_paged([s - 1 for s in seq_lens], [1] * len(seq_lens), 4, 2, 32, torch.float32,
                      seed=window, device=kernel_device)
    args = (case["q"], case["k_cache"], case["v_cache"], case["req_to_token"],
            case["req_pool_indices"], case["seq_lens"])
    want = decode_attention(*args, scale=0.2, window=window, backend="torch")
    got = decode_attention(*args, scale=0.2, window=window, num_kv_splits=num_kv_splits,
                           backend="triton")
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_decode_kernel_window_skips_the_shared_prefix_cascade(kernel_device):
    """Rows that share a 70-slot prefix: a windowed call attends each request alone (a shared
    prefix plan passed in is ignored), and still matches the reference."""
    from radixflow.kernels.triton.decode_plan import plan_shared_prefix

    q, k_cache, v_cache, table, rows, lens = make_shared(
        [(70, [3, 9, 1])], num_heads=4, num_kv_heads=2, head_dim=32, dtype=torch.float32,
        device=kernel_device)
    plan = plan_shared_prefix(table, rows, lens)
    assert plan is not None and plan.lens.tolist() == [70, 70, 70]
    for window in (4, 30, 75):
        want = decode_attention(q, k_cache, v_cache, table, rows, lens, scale=0.2,
                                window=window, backend="torch")
        got = decode_attention(q, k_cache, v_cache, table, rows, lens, scale=0.2,
                               window=window, shared_prefix=plan, num_kv_splits=2,
                               backend="triton")
        torch.testing.assert_close(got, want, **TOL[torch.float32])
