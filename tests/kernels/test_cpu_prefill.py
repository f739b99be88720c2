"""One request's causal prefill attention (kernels.cpu.prefill: tiles of tokens x query heads
against blocks of 64 keys) against its fp32 torch reference at every level this machine runs
(avx512: bf16 queries, vdpbf16ps; avx2: fp32 queries, FMA): prompts alone and after a cached
prefix, tiles and blocks cut at every edge, GQA groups, head widths, KV slots in any order,
strided queries; and the refusals.

Tolerance: the reference takes the same (bf16-rounded) queries, keys and values; avx512
rounds the softmax weights to bf16 before the value product and its output to bf16.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow.kernels.cpu import prefill


@pytest.fixture
def level(cpu_level):
    if prefill.io_dtype() is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here (no C compiler?)")
    return cpu_level


def case(n: int, prefix: int, heads: int, kv_heads: int, head_dim: int, *, pool: int = 0,
         seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pool = pool or prefix + n + 5
    k = torch.randn(pool, kv_heads, head_dim, generator=g).bfloat16()
    v = torch.randn(pool, kv_heads, head_dim, generator=g).bfloat16()
    slots = torch.randperm(pool, generator=g)[:prefix + n]
    # q as the model hands it over: the q heads of a [tokens, q + k heads, d] projection
    qk = torch.randn(n, heads + kv_heads, head_dim, generator=g).bfloat16().to(prefill.io_dtype())
    return qk[:, :heads], k, v, slots


def check(n, prefix, heads, kv_heads, head_dim, seed=0):
    q, k, v, slots = case(n, prefix, heads, kv_heads, head_dim, seed=seed)
    scale = head_dim ** -0.5
    out = prefill.prefill_attention(q, k, v, slots, prefix, scale)
    assert out.shape == (n, heads, head_dim) and out.dtype == prefill.io_dtype()
    torch.testing.assert_close(out.float(), prefill.reference(q, k, v, slots, prefix, scale),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("n, prefix, heads, kv_heads, head_dim", [
    (1024, 0, 9, 3, 64),  # the default model's prompt: 25 tiles of 42 tokens, 16 key blocks
    (30, 1000, 9, 3, 64),  # a short turn after a cached prefix: one tile, 17 blocks
    (1, 0, 4, 2, 32),  # one token, one key
    (43, 21, 9, 3, 64),  # a tile and one token; the diagonal inside a block
    (64, 64, 1, 1, 128),  # MHA, 128 queries per tile, blocks cut at the diagonal
    (17, 0, 16, 1, 16),  # a group of 16: 8 tokens a tile
    (33, 5, 6, 3, 48),  # head width not a multiple of 32
    (9, 2, 2, 2, 256),
])
def test_matches_reference(level, n, prefix, heads, kv_heads, head_dim):
    check(n, prefix, heads, kv_heads, head_dim)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 140), prefix=st.integers(0, 140), kv_heads=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 2, 3, 4, 7]), head_dim=st.sampled_from([16, 32, 64, 80]),
       seed=st.integers(0, 1 << 16))
def test_matches_reference_any_shape(level, n, prefix, kv_heads, group, head_dim, seed):
    check(n, prefix, kv_heads * group, kv_heads, head_dim, seed)


def test_fills_out_rows_in_place(level):
    q, k, v, slots = case(20, 7, 4, 2, 32)
    out = torch.zeros(30, 4, 32, dtype=prefill.io_dtype())
    prefill.prefill_attention(q, k, v, slots, 7, 32 ** -0.5, out=out[5:25])
    assert out[:5].abs().sum() == 0 and out[25:].abs().sum() == 0
    torch.testing.assert_close(out[5:25].float(), prefill.reference(q, k, v, slots, 7),
                               atol=2e-2, rtol=2e-2)


def test_refusals(level):
    q, k, v, slots = case(8, 4, 4, 2, 32)
    with pytest.raises(ValueError, match="12 slots"):
        prefill.prefill_attention(q, k, v, slots[:-1], 4, 0.1)
    other = torch.float16
    with pytest.raises(ValueError, match="queries here"):
        prefill.prefill_attention(q.to(other), k, v, slots, 4, 0.1)
    with pytest.raises(ValueError, match="bf16 KV pool"):
        prefill.prefill_attention(q, k.float(), v.float(), slots, 4, 0.1)
    with pytest.raises(ValueError, match="contiguous"):
        heads_apart = q.transpose(0, 1).contiguous().transpose(0, 1)
        prefill.prefill_attention(heads_apart, k, v, slots, 4, 0.1)
    odd = torch.randn(8, 4, 30).to(prefill.io_dtype())
    kv = torch.randn(20, 2, 30).bfloat16()
    assert not prefill.supported(4, 2, 30, prefill.io_dtype())
    assert prefill.supported(4, 2, 32, prefill.io_dtype())
    with pytest.raises(ValueError, match="head_dim=30"):
        prefill.prefill_attention(odd, kv, kv, slots, 4, 0.1)
