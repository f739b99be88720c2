"""The tiled matrix products (kernels/cpu/gemv_<level>.c) against their torch reference, at
each instruction-set level this machine runs (the cpu_level fixture)."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from helpers.tiled_weights import FORMATS, INTEGER_FORMATS, SUPER_BLOCK_FORMATS, cases
from helpers.tiled_weights import tiled_weights as _weights

from radixflow.kernels import cpu


@pytest.fixture
def level(cpu_level):
    """The level in force, its build loaded: a build that fails to compile fails the test,
    except where there is no C compiler at all."""
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    assert cpu.available(), f"the {cpu_level} build did not load (see the log)"
    return cpu_level


def _int8_x(x: torch.Tensor) -> torch.Tensor:
    """x as the AVX2 build's rf_split_x quantizes it, in float64: per group of 32, s =
    max|x| / 127 and X = round(x * (127 / max|x|)) (to nearest even, fp32 arithmetic as the C
    code's), x ~= s X; a group of zeros gives s = 0, X = 0."""
    groups = x.float().view(x.shape[0], -1, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q = (groups * inv).round()
    return (q.double() * (amax / 127).double()).view(x.shape)


def _int8_bound(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """Per output, a bound on what quantizing x to int8 (_int8_x) costs: each value moves by at
    most s / 2 = max|x_group| / 254, so sum over groups of max|x_group| / 254 * sum |w| there."""
    amax = x.abs().view(x.shape[0], -1, 32).amax(-1).repeat_interleave(32, 1)
    return (amax.double() / 254) @ dense.abs().double().T


BATCH_INT8_ROWS = 3  # gemv.h's: from this many rows the AVX-512 nibble products take int8 x


def _int8_x_at(level: str, fmt: str, m: int) -> bool:
    """Whether the kernels quantize x to int8 per group (_int8_x) for m rows of fmt."""
    return level == "avx2" or (fmt != "q8_0" and fmt != "bf16"
                               and (m >= BATCH_INT8_ROWS or fmt in cpu.INT8_X_FROM_ONE_ROW))


def _allowed_error(level: str, fmt: str, x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """The most each output may differ from cpu.reference (fp32 x times the weights)."""
    scale = x.abs().max() * dense.abs().sum(1).max()  # bound on any output's magnitude
    if fmt == "bf16":  # exact products of bf16 values, fp32 sums, at every level
        return torch.full((x.shape[0], dense.shape[0]), 1e-6 * float(scale), dtype=torch.float64)
    if not _int8_x_at(level, fmt, x.shape[0]):
        # x split into 16-bit steps of max|x_group| / 32639: ~3e-5 of the scale
        return torch.full((x.shape[0], dense.shape[0]), 1e-4 * float(scale), dtype=torch.float64)
    # x quantized to int8 per group (_int8_bound), plus fp32 sums' rounding
    return _int8_bound(x, dense) + 1e-5 * float(scale)


def _assert_within(out: torch.Tensor, ref: torch.Tensor, allowed: torch.Tensor) -> None:
    err = (out.double() - ref.double()).abs()
    worst = int((err - allowed).argmax())
    assert (err <= allowed).all(), (
        f"|error| {float(err.flatten()[worst]):.3g} over the bound "
        f"{float(allowed.flatten()[worst]):.3g} at flat index {worst}")


SHAPES = [(16, 32), (37, 64), (200, 576), (48, 1536), (16, 256), (37, 768)]


@pytest.mark.parametrize(("fmt", "n", "k"), cases(FORMATS, SHAPES))
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


@pytest.mark.parametrize(("fmt", "n", "k"), cases(FORMATS, SHAPES))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 11])
def test_gemm_matches_reference(level, fmt, n, k, m):
    tiled, dense = _weights(fmt, n, k, seed=3 * n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    x[0, :32] = 0  # an all-zero group: scale 0 must not divide by zero
    ref = cpu.reference(x, tiled)
    allowed = _allowed_error(level, fmt, x, dense)
    _assert_within(cpu.gemm(x, tiled), ref, allowed)
    out = cpu.gemm(x, tiled, torch.bfloat16)
    assert out.dtype == torch.bfloat16
    _assert_within(out.float(), ref, allowed + 1e-2 * ref.abs().double())


@pytest.mark.parametrize("fmt", INTEGER_FORMATS)
@pytest.mark.parametrize("n", [16 * 12 * 2 + 16 * 5, 3000])  # whole stream sets and a rest
@pytest.mark.parametrize("m", [1, 2])
def test_one_or_two_rows_read_tiles_in_streams_and_match(level, fmt, n, m):
    k = 512 if fmt in SUPER_BLOCK_FORMATS else 96
    tiled, dense = _weights(fmt, n, k, seed=n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n))
    _assert_within(cpu.gemm(x, tiled), cpu.reference(x, tiled),
                   _allowed_error(level, fmt, x, dense))


def test_gemm_is_closer_to_exact_than_bf16_activations(level):
    """The AVX-512 kernels' split of x (16 bits per group) loses far less than rounding x to
    bf16, which is what the bf16 model does anyway."""
    if level != "avx512":
        pytest.skip("the AVX-512 split of x; avx2 quantizes x to int8 (next test)")
    tiled, dense = _weights("q4_1", 64, 576, seed=9)
    x = torch.randn(2, 576, generator=torch.Generator().manual_seed(9))  # (a batch's: int8)
    exact = x.double() @ dense.double().T
    kernel = (cpu.gemm(x, tiled).double() - exact).abs().max()
    bf16 = (x.bfloat16().double() @ dense.double().T - exact).abs().max()
    assert kernel < bf16 / 20


@pytest.mark.parametrize(("fmt", "n", "k"), cases(INTEGER_FORMATS, [(64, 576), (200, 1536)]))
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8])
def test_int8_x_products_are_int8_x_exactly(level, fmt, n, k, m):
    """Where the kernels quantize x to int8 per group (every product at avx2, a batch's nibble
    products at avx512) they compute exactly that x (_int8_x) times the weights (q4_1's
    minimums included), up to fp32 sums' rounding, and so stay within the int8 bound of exact."""
    if not _int8_x_at(level, fmt, m):
        pytest.skip("x split into 16-bit integers here")
    tiled, dense = _weights(fmt, n, k, seed=n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)) * 3
    x[:, 32:64] *= 1e-3  # groups of very different magnitudes
    x[-1, :32] = 0
    kernel = cpu.gemm(x, tiled).double()
    exact = x.double() @ dense.double().T
    emulated = _int8_x(x) @ dense.double().T
    magnitude = float((x.abs().double() @ dense.abs().double().T).max())
    # fp32 sums' rounding: ~3e-8 of the magnitude; int8 x moves the outputs by ~5e-4 to 1e-3
    tol = 2e-7 * magnitude
    torch.testing.assert_close(kernel, emulated, atol=tol, rtol=0)
    assert (emulated - exact).abs().max() > 100 * tol  # so the emulation is what is matched
    bound = _int8_bound(x, dense)
    assert ((emulated - exact).abs() <= bound).all()
    _assert_within(kernel, exact, bound + tol)


@pytest.mark.parametrize("fmt", ["q5_k", "q6", "q6_k"])
@pytest.mark.parametrize("m", [1, 2, 5])
def test_compute_bound_formats_take_16_bit_x_when_told_never_int8(level, fmt, m):
    """q5_k/q6/q6_k take int8 x from one row on (gemv.h's split_mode: their 16-bit products are
    compute-bound); with --cpu-batch-int8-rows 0 they split x into 16-bit integers, at
    avx512, as the other formats do: within 1e-4 of the scale, past int8's rounding."""
    if level != "avx512":
        pytest.skip("the AVX-512 split of x; avx2 quantizes x to int8")
    tiled, dense = _weights(fmt, 16 * 12 * 2 + 16 * 5, 512, seed=m)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    exact = x.double() @ dense.double().T
    int8 = (cpu.gemm(x, tiled).double() - exact).abs().max()
    try:
        cpu.set_batch_int8_rows(0)
        out = cpu.gemm(x, tiled)
    finally:
        cpu.set_batch_int8_rows(BATCH_INT8_ROWS)
    scale = float(x.abs().max() * dense.abs().sum(1).max())
    _assert_within(out, cpu.reference(x, tiled), torch.full_like(exact, 1e-4 * scale))
    assert (out.double() - exact).abs().max() < int8 / 10


def test_q6_refuses_what_it_cannot_hold():
    q = torch.zeros(16, 32, dtype=torch.int8)
    with pytest.raises(ValueError, match="-32..31"):
        cpu.tile_q6(q + 32, torch.ones(16, 2))
    with pytest.raises(cpu.ScaleOverflow, match="fp16"):
        cpu.tile_q6(q, torch.full((16, 2), 1e5))
    with pytest.raises(ValueError, match=r"scales of shape \[16, 2\]"):
        cpu.tile_q6(q, torch.ones(16, 1))


def test_q4_k_refuses_what_it_cannot_hold():
    q, six = torch.zeros(16, 256, dtype=torch.uint8), torch.zeros(16, 8, dtype=torch.uint8)
    half = torch.ones(16, 1)
    with pytest.raises(ValueError, match="0..15"):
        cpu.tile_q4_k(q + 16, six, six, half, half)
    with pytest.raises(ValueError, match="six-bit"):
        cpu.tile_q4_k(q, six + 64, six, half, half)
    with pytest.raises(ValueError, match=r"dmin of shape \[16, 1\]"):
        cpu.tile_q4_k(q, six, six, half, torch.ones(16, 2))
    with pytest.raises(ValueError, match="multiple of 256"):
        cpu.tile_q4_k(q[:, :128], six[:, :4], six[:, :4], half, half)


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
    cpu._library_for.cache_clear()
    try:
        assert not cpu.available()
    finally:
        cpu._library_for.cache_clear()


@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_rows_is_unpack_indexed(fmt):
    """An embedding lookup in tiles (stored_linears.TiledEmbedding) reads the rows unpack has."""
    from radixflow.runtime.models.quant_linear import quantize_groups

    torch.manual_seed(0)
    w = torch.randn(37, 96)
    tiled = {"q4_1": lambda: cpu.tile_q4_1(*quantize_groups(w)),
             "q4_0": lambda: _weights("q4_0", 37, 96)[0],
             "q5_0": lambda: _weights("q5_0", 37, 96)[0],
             "q5_1": lambda: _weights("q5_1", 37, 96)[0],
             "q8_0": lambda: cpu.tile_q8_0(cpu.quantize_q8_0(w)),
             "q6": lambda: _weights("q6", 37, 96)[0],
             "q4_k": lambda: _weights("q4_k", 37, 256)[0],
             "q5_k": lambda: _weights("q5_k", 37, 256)[0],
             "q6_k": lambda: _weights("q6_k", 37, 256)[0],
             "q3_k": lambda: _weights("q3_k", 37, 256)[0],
             "q2_k": lambda: _weights("q2_k", 37, 256)[0],
             "iq4_nl": lambda: _weights("iq4_nl", 37, 96)[0],
             "iq4_xs": lambda: _weights("iq4_xs", 37, 256)[0],
             "bf16": lambda: cpu.tile_bf16(w)}[fmt]()
    ids = torch.tensor([0, 5, 36, 16, 17, 5])
    assert torch.equal(cpu.gather_rows(tiled, ids).view(torch.int32),
                       cpu.unpack(tiled)[ids].view(torch.int32))
    with pytest.raises(IndexError):
        cpu.gather_rows(tiled, torch.tensor([37]))
