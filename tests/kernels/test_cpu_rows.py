"""The row kernels of an extend forward (kernels.cpu.rows: residual add + RMSNorm, rope,
SiLU(gate) * up) against the torch model's own ops, at every level this machine runs, in bf16
and fp32, one row and many (many rows split over the threads), widths cut at every chunk edge.

Tolerance: elementwise results round where torch's ops round, so the residual sum and rope are
equal bit for bit; the RMSNorm's sum of squares is added in another order and the SiLU's exp
is another approximation, so those may be one rounding step of the dtype apart.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow.kernels.cpu import available
from radixflow.kernels.cpu.rows import RowKernels, reference_add_rms_norm, reference_silu_mul
from radixflow.runtime.models.rope import RotaryEmbedding, apply_rope

DTYPES = [torch.bfloat16, torch.float32]


@pytest.fixture
def kernels(cpu_level):
    if not available():
        pytest.skip(f"no CPU kernels at {cpu_level} here (no C compiler?)")
    return RowKernels()


def one_step(dtype: torch.dtype) -> dict:
    """Closeness of a rounding step of `dtype` (relative), on values of size ~1."""
    step = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -20  # (fp32: a few steps)
    return {"atol": step, "rtol": step}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 576), (256, 576), (3, 1000), (70, 512), (2, 7)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(kernels, dtype, rows, n, with_delta):
    g = torch.Generator().manual_seed(rows * n)
    x = (torch.randn(rows, n, generator=g) * 3).to(dtype)
    delta = torch.randn(rows, n, generator=g).to(dtype) if with_delta else None
    weight = (torch.rand(n, generator=g) + 0.5).to(dtype)
    want_x, want = reference_add_rms_norm(x, delta, weight, 1e-5)
    got = kernels.add_rms_norm(x, delta, weight, 1e-5)  # x updated in place
    assert got is not None and got.dtype == dtype and got.shape == (rows, n)
    assert torch.equal(x, want_x)
    torch.testing.assert_close(got, want, **one_step(dtype))
    if dtype == torch.bfloat16:  # rare single steps, where the fp32 value sat near a tie
        assert (got != want).float().mean() < 0.02


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, heads, kv_heads, head_dim", [
    (1, 9, 3, 64), (256, 9, 3, 64), (5, 4, 4, 128), (40, 2, 1, 16)])
def test_rope_in_place(kernels, dtype, tokens, heads, kv_heads, head_dim):
    g = torch.Generator().manual_seed(tokens)
    rope = RotaryEmbedding(head_dim, 4096, 10000.0, None)
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    cos, signed_sin = rope.tables(positions, dtype)
    # q and k heads as the model rotates them: a view into the rows of the qkv projection
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    qk = qkv[:, :(heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    want = apply_rope(qk, cos, signed_sin)
    v_before = qkv[:, (heads + kv_heads) * head_dim:].clone()
    assert kernels.rope_(qk, cos, signed_sin)
    assert torch.equal(qk, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim:], v_before)  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 1536), (256, 1536), (3, 513), (2, 5)])
def test_silu_mul(kernels, dtype, rows, n):
    g = torch.Generator().manual_seed(n)
    gate_up = (torch.randn(rows, 2 * n, generator=g) * 4).to(dtype)
    got = kernels.silu_mul(gate_up)
    want = reference_silu_mul(gate_up)
    assert got is not None and got.shape == (rows, n)
    torch.testing.assert_close(got, want, **one_step(dtype))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 80), n=st.integers(1, 1100), scale=st.floats(1e-3, 1e3),
       bf16=st.booleans())
def test_add_rms_norm_any_shape(kernels, rows, n, scale, bf16):
    dtype = torch.bfloat16 if bf16 else torch.float32
    g = torch.Generator().manual_seed(rows + n)
    x = (torch.randn(rows, n, generator=g) * scale).to(dtype)
    delta = (torch.randn(rows, n, generator=g) * scale).to(dtype)
    weight = torch.randn(n, generator=g).to(dtype)
    want_x, want = reference_add_rms_norm(x, delta, weight, 1e-6)
    got = kernels.add_rms_norm(x, delta, weight, 1e-6)
    assert torch.equal(x, want_x)
    torch.testing.assert_close(got, want, **one_step(dtype))


def test_refuses_what_it_does_not_take(kernels):
    x = torch.randn(4, 64)
    assert kernels.add_rms_norm(x.half(), None, torch.ones(64).half(), 1e-5) is None  # dtype
    assert kernels.add_rms_norm(x, None, torch.ones(64).bfloat16(), 1e-5) is None  # mixed
    assert kernels.add_rms_norm(x.t(), None, torch.ones(4), 1e-5) is None  # not contiguous
    assert kernels.add_rms_norm(x, torch.randn(2, 64), torch.ones(64), 1e-5) is None  # shape
    assert kernels.silu_mul(torch.randn(4, 7)) is None  # odd width
    qk = torch.randn(3, 2, 64)
    cos = torch.ones(3, 1, 64)
    assert not kernels.rope_(qk.transpose(1, 2), cos, cos)  # heads not contiguous
    assert not kernels.rope_(qk, cos[:2], cos[:2])  # a table row per token
    assert kernels.rope_(qk.clone(), cos, cos)
