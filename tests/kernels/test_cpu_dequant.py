"""Dequantizing tiled weights into dense rows (kernels/cpu: rf_dequant_tiles per level) and the
many-row product over them (gemm_dequant), at each instruction-set level this machine runs
(the cpu_level fixture): the rows bit for bit `unpack`'s, rounded as torch rounds."""

from __future__ import annotations

import pytest
import torch
from helpers.tiled_weights import FORMATS, SUPER_BLOCK_FORMATS, cases
from helpers.tiled_weights import tiled_weights as _weights

from radixflow.kernels import cpu

SHAPES = [(16, 32), (37, 64), (200, 576), (48, 1536), (50, 96), (16, 256), (37, 768)]


@pytest.fixture
def level(cpu_level):
    if not cpu.available():
        pytest.skip(f"no CPU kernels at {cpu_level} here (no C compiler?)")
    return cpu_level


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


@pytest.mark.parametrize(("fmt", "n", "k"), cases(FORMATS, SHAPES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dequantized_rows_are_unpack_bit_for_bit(level, fmt, n, k, dtype):
    tiled, _ = _weights(fmt, n, k, seed=n * k)
    assert tiled.level == level
    full = cpu.unpack(tiled).to(dtype)
    tail = n // 32 * 16  # a start inside, on a tile boundary, to the last (partial) tile
    for start, rows in [(0, n), (0, min(n, 5)), (tail, n - tail), (16, min(n - 16, 21))]:
        if rows <= 0:
            continue
        out = cpu.dequantize(tiled, start, rows, dtype)
        assert out.shape == (rows, k) and out.dtype == dtype
        assert torch.equal(_bits(out), _bits(full[start:start + rows])), (start, rows)


@pytest.mark.parametrize("k", [100, 130])  # bf16 pairs not a whole transpose block
def test_bf16_rows_with_a_ragged_k(level, k):
    tiled, dense = _weights("bf16", 40, k, seed=k)
    for dtype in (torch.bfloat16, torch.float32):
        assert torch.equal(_bits(cpu.dequantize(tiled, 16, 24, dtype)),
                           _bits(dense[16:40].to(dtype)))


def test_q4_1_rounding_to_bf16_is_torchs(level):
    """Values whose fp32 m + d q falls between bf16 numbers (ties included) round as torch
    rounds: to nearest, ties to even."""
    n, k = 32, 64
    q = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0))
    scale = torch.full((n, k // 32), 2.0 ** -9)  # d q: bits below bf16's 8 near 1
    low = torch.tensor([1.0, 1.0 + 2.0 ** -10]).expand(n, 2)  # ties (q = 2 mod 4), and not
    tiled = cpu.tile_q4_1(q, scale, low)
    ref = cpu.unpack(tiled)
    assert not torch.equal(ref.bfloat16().float(), ref)  # so the rounding is exercised
    assert torch.equal(_bits(cpu.dequantize(tiled)), _bits(ref.bfloat16()))


def test_bad_ranges_are_named(level):
    tiled, _ = _weights("q8_0", 40, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu.dequantize(tiled, 8, 8)
    with pytest.raises(ValueError, match=r"rows \[32, 48\) of 40"):
        cpu.dequantize(tiled, 32, 16)
    with pytest.raises(ValueError, match="contiguous"):
        cpu.dequantize(tiled, 0, 16, out=torch.empty(16, 64))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m", [9, 64, 300])
@pytest.mark.parametrize("block", [None, 64])
def test_blockwise_product_is_x_times_the_unpacked_weights(level, fmt, m, block):
    """n = 200 and k = 160 (q4_k: 256) are no multiples of a block of 64 rows (nor of the
    default's)."""
    n, k = 200, 256 if fmt in SUPER_BLOCK_FORMATS else 160
    tiled, _ = _weights(fmt, n, k, seed=m)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).bfloat16()
    bias = torch.randn(n, generator=gen).bfloat16()
    weights = cpu.unpack(tiled).bfloat16().float()  # what the blocks hold
    exact = x.float() @ weights.T
    for b in (None, bias):
        out = cpu.gemm_dequant(x, tiled, torch.bfloat16, b, rows_per_block=block)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        ref = exact if b is None else exact + b.float()
        # bf16 GEMM: fp32 sums, one bf16 rounding of the result (and of the bias)
        scale = float((x.float().abs() @ weights.abs().T).max())
        torch.testing.assert_close(out.float(), ref, atol=1e-3 * scale, rtol=1e-2)
    # an fp32 product (an fp32 model at level avx2): fp32 x times the same weights
    out = cpu.gemm_dequant(x.float(), tiled, torch.float32, rows_per_block=block)
    torch.testing.assert_close(out, x.float() @ cpu.unpack(tiled).T, atol=1e-4, rtol=1e-4)


def test_blocks_are_whole_tiles_sized_to_the_scratch():
    assert cpu.block_rows(2048) == 256 and cpu.block_rows(8192) == 64
    assert cpu.block_rows(1 << 20) == cpu.TILE  # never below one tile
    assert cpu.block_rows(2048, torch.float32) == 128
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu.gemm_dequant(torch.randn(9, 64), _weights("q8_0", 40, 64)[0], rows_per_block=24)


def test_without_the_library_the_reference_answers(monkeypatch):
    tiled, _ = _weights("q4_1", 40, 64)
    monkeypatch.setattr(cpu, "_library", lambda at=None: None)
    assert torch.equal(cpu.dequantize(tiled, 16, 24), cpu.unpack(tiled)[16:].bfloat16())
    x = torch.randn(10, 64)
    torch.testing.assert_close(cpu.gemm_dequant(x, tiled, torch.float32),
                               x @ cpu.unpack(tiled).T, atol=1e-4, rtol=1e-4)
