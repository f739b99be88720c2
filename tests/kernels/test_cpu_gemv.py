"""The AVX-512 tiled matrix products (kernels/cpu/gemv.c) against their torch reference."""

from __future__ import annotations

import pytest
import torch
from radixflow.kernels import cpu

needs_kernels = pytest.mark.skipif(not cpu.available(), reason="no AVX-512 BF16/VNNI kernels here")


def _q4_1_groups(n: int, k: int, seed: int):
    """Q4_1 groups as a GGUF holds them: q in 0..15, fp16 scales and minimums."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen)
    scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(n, k // 32, generator=gen) * 0.1).half().float()
    return q, scale, low


def _weights(fmt: str, n: int, k: int, seed: int = 0) -> tuple[cpu.TiledWeight, torch.Tensor]:
    """A tiled weight and the fp32 weights it must hold."""
    if fmt == "q4_1":
        q, scale, low = _q4_1_groups(n, k, seed)
        dense = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
        return cpu.tile_q4_1(q, scale, low), dense
    gen = torch.Generator().manual_seed(seed)
    if fmt == "q8_0":
        w = cpu.quantize_q8_0(torch.randn(n, k, generator=gen) * 0.05)
        return cpu.tile_q8_0(w), cpu.unpack_q8_0(w)
    dense = torch.randn(n, k, generator=gen).bfloat16().float()
    return cpu.tile_bf16(dense), dense


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "bf16"])
@pytest.mark.parametrize(("n", "k"), [(16, 32), (37, 64), (200, 576), (48, 1536)])
def test_tiling_keeps_every_weight(fmt, n, k):
    tiled, dense = _weights(fmt, n, k, seed=n + k)
    assert tiled.shape == (n, k)
    torch.testing.assert_close(cpu.unpack(tiled), dense, atol=0, rtol=0)


def test_q8_0_quantization_is_exact_on_8bit_groups():
    torch.manual_seed(1)
    q = torch.randint(-127, 128, (5, 64)).float()
    q[:, ::32] = -127
    scale = torch.rand(5, 2) * 0.01 + 1e-3
    dense = q * scale.repeat_interleave(32, 1)
    w = cpu.quantize_q8_0(dense)
    assert w.q.dtype == torch.int8 and w.scale.shape == (5, 2)
    torch.testing.assert_close(cpu.unpack_q8_0(w), dense, atol=0, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "bf16"])
@pytest.mark.parametrize(("n", "k"), [(16, 32), (37, 64), (200, 576), (48, 1536)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 11])
def test_gemm_matches_reference(fmt, n, k, m):
    tiled, dense = _weights(fmt, n, k, seed=3 * n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[0, :32] = 0  # an all-zero group: scale 0 must not divide by zero
    ref = cpu.reference(x, tiled)
    scale = x.abs().max() * dense.abs().sum(1).max()  # bound on any output's magnitude
    # integer kernels split x into 16-bit steps of max|x_group| / 32639: ~3e-5 of the scale
    tol = 1e-4 if fmt != "bf16" else 1e-6
    torch.testing.assert_close(cpu.gemm(x, tiled), ref, atol=float(tol * scale), rtol=0)
    out = cpu.gemm(x, tiled, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=float(tol * scale), rtol=1e-2)


@needs_kernels
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [16 * 12 * 2 + 16 * 5, 3000])  # whole stream sets and a rest
@pytest.mark.parametrize("m", [1, 2])
def test_one_or_two_rows_read_tiles_in_streams_and_match(fmt, n, m):
    tiled, dense = _weights(fmt, n, 96, seed=n)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(n))
    scale = x.abs().max() * dense.abs().sum(1).max()
    torch.testing.assert_close(cpu.gemm(x, tiled), cpu.reference(x, tiled),
                               atol=float(1e-4 * scale), rtol=0)


@needs_kernels
def test_gemm_is_closer_to_exact_than_bf16_activations():
    """The integer kernels' split of x (16 bits per group) loses far less than rounding x to
    bf16, which is what the bf16 model does anyway."""
    tiled, dense = _weights("q4_1", 64, 576, seed=9)
    x = torch.randn(4, 576, generator=torch.Generator().manual_seed(9))
    exact = x.double() @ dense.double().T
    kernel = (cpu.gemm(x, tiled).double() - exact).abs().max()
    bf16 = (x.bfloat16().double() @ dense.double().T - exact).abs().max()
    assert kernel < bf16 / 20


def test_without_the_library_the_reference_answers(monkeypatch):
    monkeypatch.setattr(cpu, "_library", lambda: None)
    tiled, _ = _weights("q8_0", 6, 64)
    x = torch.randn(2, 64)
    torch.testing.assert_close(cpu.gemm(x, tiled), cpu.reference(x, tiled))
    assert not cpu.available()


def test_bad_shapes_are_named():
    tiled, _ = _weights("q4_1", 4, 64)
    with pytest.raises(ValueError, match=r"expected x of shape \[M, 64\]"):
        cpu.gemm(torch.randn(1, 32), tiled)
    with pytest.raises(ValueError, match="multiple of 2"):
        cpu.tile_bf16(torch.randn(4, 33))
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu.tile_q8_0(cpu.Q8_0Weight(torch.zeros(4, 48, dtype=torch.int8), torch.ones(4, 1)))


def test_compile_failure_turns_the_kernels_off(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    cpu._library.cache_clear()
    try:
        assert not cpu.available()
    finally:
        cpu._library.cache_clear()
