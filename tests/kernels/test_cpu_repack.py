"""rf_repack (kernels/cpu/repack.c): a GGUF tensor's blocks straight into the tiles, at each
instruction-set level this machine runs (the cpu_level fixture): bit for bit the tiles that
tile_* writes from gguf_blocks' group forms (the torch path), on blocks whose every byte takes
all 256 values and whose fp16 scales run through zeros, subnormals and the largest finite."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.gguf_test_blocks import covering_blocks

from radixflow.kernels import cpu
from radixflow.kernels import gguf_blocks as gb


@pytest.fixture
def level(cpu_level):
    if not cpu.available():
        pytest.skip(f"no CPU kernels at {cpu_level} here (no C compiler?)")
    return cpu_level


def _rows(name: str, k: int, drop: int, small_scales: bool = False) -> torch.Tensor:
    raw = covering_blocks(name, n=2048, seed=k)
    if small_scales:  # |d| < 2: Q6_K's d * sc within fp16
        at = 208
        h = raw[:, at:at + 2].copy().view(np.uint16) & np.uint16(0xBFFF)
        raw[:, at:at + 2] = h.view(np.uint8)
    block, size = gb.QUANT_SIZES[gb.GGMLType[name]]
    per_row = k // block
    rows = len(raw) // per_row - drop  # the last tile partly padding
    return torch.from_numpy(raw[:rows * per_row].reshape(rows, per_row * size).copy())


def _torch_tiles(raw: torch.Tensor, name: str, fmt: str, k: int) -> cpu.TiledWeight:
    t, shape = gb.GGMLType[name], (raw.shape[0], k)
    if fmt == "q4_1":
        return cpu.tile_q4_1(*gb.affine_groups(raw, t, shape))
    if fmt in ("q4_0", "q5_0"):
        tile = cpu.tile_q4_0 if fmt == "q4_0" else cpu.tile_q5_0
        return tile(*gb.affine_groups(raw, t, shape)[:2])
    if fmt == "q5_1":
        return cpu.tile_q5_1(*gb.affine_groups(raw, t, shape))
    if fmt == "q4_k":
        return cpu.tile_q4_k(*gb.q4_k_fields(raw, shape))
    if fmt == "q5_k":
        return cpu.tile_q5_k(*gb.q4_k_fields(raw, shape, t))
    if fmt == "q6_k":
        return cpu.tile_q6_k(*gb.q6_k_fields(raw, shape))
    if fmt == "q6":
        return cpu.tile_q6(*gb.symmetric_6bit_groups(raw, t, shape))
    if fmt == "q3_k":
        return cpu.tile_q3_k(*gb.q3_k_fields(raw, shape))
    if fmt == "q2_k":
        return cpu.tile_q2_k(*gb.q2_k_fields(raw, shape))
    if fmt in ("iq4_nl", "iq4_xs"):
        tile = cpu.tile_iq4_nl if fmt == "iq4_nl" else cpu.tile_iq4_xs
        return tile(*gb.iq4_fields(raw, t, shape))
    return cpu.tile_q8_0(cpu.Q8_0Weight(*gb.symmetric_int8_groups(raw, t, shape)))


@pytest.mark.parametrize(("name", "fmt"), [("Q4_K", "q4_k"), ("Q4_K", "q4_1"), ("Q4_0", "q4_1"),
                                           ("Q4_1", "q4_1"), ("Q4_0", "q4_0"), ("Q5_0", "q5_0"),
                                           ("Q5_1", "q5_1"),
                                           ("Q5_K", "q5_k"), ("Q6_K", "q6"), ("Q6_K", "q6_k"),
                                           ("Q8_0", "q8_0"), ("IQ4_NL", "iq4_nl"),
                                           ("IQ4_XS", "iq4_xs"), ("Q3_K", "q3_k"),
                                           ("Q2_K", "q2_k")])
@pytest.mark.parametrize(("k", "drop"), [(256, 0), (512, 5), (1024, 13)])
def test_repack_writes_the_torch_paths_tiles(level, name, fmt, k, drop):
    raw = _rows(name, k, drop, small_scales=fmt == "q6")
    got = cpu.repack(raw, int(gb.GGMLType[name]), fmt, k)
    want = _torch_tiles(raw, name, fmt, k)
    assert (got.format, got.n, got.k, got.level) == (fmt, raw.shape[0], k, level)
    assert torch.equal(got.data.reshape(-1), want.data.reshape(-1))


@pytest.mark.parametrize(("name", "fmt"), [("Q4_0", "q4_0"), ("Q4_1", "q4_1"), ("Q5_0", "q5_0"),
                                           ("Q5_1", "q5_1"),
                                           ("Q4_K", "q4_k"), ("Q5_K", "q5_k"), ("Q6_K", "q6_k"),
                                           ("IQ4_NL", "iq4_nl"), ("IQ4_XS", "iq4_xs"),
                                           ("Q3_K", "q3_k"), ("Q2_K", "q2_k")])
def test_tiles_as_stored_hold_what_gguf_dequantizes(level, name, fmt):
    """A type kept as stored: its own fields (Q6_K's d up to 65504: no fp16 product to
    overflow), its bytes a weight (iq4_xs: 4.31 bits where the file has 4.25; q3_k: 3.56 where
    it has 3.44), and the values gguf dequantizes, bit for bit (Q4_0's d q - 8 d rounds once,
    as d (q - 8) does: an exact zero's sign aside; Q5_0's and IQ4's likewise, at AVX-512
    d (v + 128) - 128 d), in the tiles, an embedding lookup's rows and the C dequantization."""
    kind = gb.GGMLType[name]
    raw = _rows(name, 512, 3)
    got = cpu.repack(raw, int(kind), fmt, 512)
    want = gb.dequantize(raw, kind, (raw.shape[0], 512))
    ids = torch.tensor([0, 7, 16, raw.shape[0] - 1])
    signed_zero = kind in (gb.GGMLType.Q4_0, gb.GGMLType.Q5_0, gb.GGMLType.IQ4_NL,
                           gb.GGMLType.IQ4_XS)
    bits = (lambda t: t) if signed_zero else (lambda t: t.view(torch.int32))
    assert torch.equal(bits(cpu.unpack(got)), bits(want))
    assert torch.equal(bits(cpu.gather_rows(got, ids)), bits(want[ids]))
    assert torch.equal(bits(cpu.dequantize(got, 0, 32, torch.float32)), bits(want[:32]))
    block, size = gb.QUANT_SIZES[kind]
    per_file_byte = {"iq4_xs": (cpu.IQ4_XS_BLOCK_BYTES, 16 * size),
                     "q3_k": (cpu.Q3_K_BLOCK_BYTES, 16 * size)}.get(fmt, (1, 1))
    assert got.nbytes == (-(-raw.shape[0] // 16) * 16 * 512 * size // block
                          * per_file_byte[0] // per_file_byte[1])  # as the file


def test_q6_scales_over_fp16_are_refused_as_tile_q6_refuses(level):
    raw = _rows("Q6_K", 256, 0)  # d up to 65504, sc up to 127
    with pytest.raises(cpu.ScaleOverflow, match="fit fp16"):
        _torch_tiles(raw, "Q6_K", "q6", 256)
    with pytest.raises(cpu.ScaleOverflow, match="fit fp16.*do not"):
        cpu.repack(raw, int(gb.GGMLType.Q6_K), "q6", 256)


def test_pairs_it_does_not_convert_and_bad_rows(level):
    raw = _rows("Q4_K", 256, 0)
    assert cpu.repack(raw, int(gb.GGMLType.Q4_K), "q6", 256) is None  # the torch path's
    assert cpu.repack(raw, int(gb.GGMLType.Q5_K), "q8_0", 256) is None
    with pytest.raises(ValueError, match="rows of 288 bytes"):
        cpu.repack(raw, int(gb.GGMLType.Q4_K), "q4_1", 512)
    with pytest.raises(ValueError, match="multiples of 256 weights, not 96"):
        cpu.repack(raw[:, :100], int(gb.GGMLType.Q4_K), "q4_1", 96)
