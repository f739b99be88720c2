"""kernels/gguf_blocks.py against the `gguf` package: every type's unpacking and dequantization
equal gguf.quants.dequantize bit for bit (float32 bits compared as int32), on blocks built so that
every byte of every field takes all 256 values (so every scale/min bit pattern is exercised), on
every fp16 bit pattern as a block scale, and on real tensors gguf quantizes; the int4/int8 group
forms rebuild dequantize; the module stays a kernel leaf."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from helpers.gguf_test_blocks import HALVES, N_BLOCKS, covering_blocks, finite_halves

from radixflow.kernels import gguf_blocks as gb

TYPES = [t.name for t in gb.GGMLType]


def bits(x) -> torch.Tensor:
    x = torch.as_tensor(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x
    return x.contiguous().view(torch.int32).reshape(-1)


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gguf_dequantize(raw, GGMLQuantizationType[name])


def test_type_table_mirrors_gguf():
    for t in gb.GGMLType:
        assert GGMLQuantizationType[t.name] == int(t)
        assert gb.QUANT_SIZES[t] == GGML_QUANT_SIZES[GGMLQuantizationType[t.name]]
    assert set(gb.QUANT_SIZES) == set(gb.GGMLType) == set(gb.FIELDS)
    assert gb.QK_K == 256
    from gguf.quants import IQ4_NL
    assert tuple(IQ4_NL.kvalues) == gb.KVALUES_IQ4NL
    assert gb.ggml_type(GGMLQuantizationType.Q4_K) is gb.GGMLType.Q4_K
    assert gb.ggml_type("q6_k") is gb.ggml_type(14) is gb.GGMLType.Q6_K
    for bad in ("IQ2_XXS", GGMLQuantizationType.IQ2_XXS, 99):
        with pytest.raises(ValueError):
            gb.ggml_type(bad)
    assert gb.row_bytes("Q4_K", 2048) == 8 * 144
    with pytest.raises(ValueError):
        gb.row_bytes("Q4_K", 100)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_equals_gguf_bit_for_bit(name, kernel_device):
    raw = covering_blocks(name)
    block = gb.QUANT_SIZES[gb.GGMLType[name]][0]
    expected = bits(reference(raw, name))
    rows = 4
    cols = N_BLOCKS * block // rows
    got = gb.dequantize(torch.from_numpy(raw).to(kernel_device), name, (rows, cols))
    assert got.dtype == torch.float32 and got.shape == (rows, cols)
    assert torch.equal(bits(got.cpu()), expected)
    # flat numpy bytes, flat result
    flat = gb.dequantize(raw.reshape(-1), GGMLQuantizationType[name])
    assert flat.shape == (N_BLOCKS * block,) and torch.equal(bits(flat), expected)


@pytest.mark.parametrize("name", TYPES)
def test_unpack_fields(name):
    """Shapes, dtypes and ranges of each type's fields, and that the blocks of the bit-exact test
    give every scale and min every value it can hold, at every position."""
    t = gb.GGMLType[name]
    block = gb.QUANT_SIZES[t][0]
    raw = torch.from_numpy(covering_blocks(name))
    f = gb.unpack(raw, name)
    assert type(f) is gb.FIELDS[t]
    if t in (gb.GGMLType.F32, gb.GGMLType.F16, gb.GGMLType.BF16):
        dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[name]
        assert f.values.dtype == dtype and f.values.shape == (N_BLOCKS,)
        assert torch.equal(f.values.view(torch.uint8), raw.reshape(-1))
        return
    for field in ("d", "dmin", "m"):
        if hasattr(f, field):
            value = getattr(f, field)
            assert value.dtype == torch.float32 and value.shape == (N_BLOCKS,)
            assert torch.isfinite(value).all()
    q_range = {"Q4_0": (0, 15), "Q4_1": (0, 15), "Q5_0": (0, 31), "Q5_1": (0, 31),
               "Q8_0": (-128, 127), "Q2_K": (0, 3), "Q3_K": (-4, 3), "Q4_K": (0, 15),
               "Q5_K": (0, 31), "Q6_K": (-32, 31), "IQ4_NL": (0, 15), "IQ4_XS": (0, 15)}[name]
    signed = name in ("Q8_0", "Q3_K", "Q6_K")
    assert f.qs.dtype == (torch.int8 if signed else torch.uint8)
    assert f.qs.shape == (N_BLOCKS, block)
    values = torch.unique(f.qs.int())
    assert values.tolist() == list(range(q_range[0], q_range[1] + 1))
    per_scale = {"Q2_K": (16, 0, 15), "Q3_K": (16, -32, 31), "Q4_K": (8, 0, 63),
                 "Q5_K": (8, 0, 63), "Q6_K": (16, -128, 127), "IQ4_XS": (8, -32, 31)}
    if name in per_scale:
        count, low, high = per_scale[name]
        fields = [f.scales] + ([f.mins] if hasattr(f, "mins") else [])
        for scales in fields:
            assert scales.shape == (N_BLOCKS, count)
            assert scales.dtype == (torch.uint8 if low == 0 else torch.int8)
            for j in range(count):
                assert torch.unique(scales[:, j].int()).tolist() == list(range(low, high + 1))


def test_layouts_by_hand():
    """A few fields placed by hand, read back where ggml's layouts put them."""
    # Q4_0: byte j holds weights j (low nibble) and j + 16 (high)
    raw = torch.zeros(18, dtype=torch.uint8)
    raw[0:2] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # d = 1.0
    raw[2 + 3] = 0xA5
    f = gb.unpack(raw, "Q4_0")
    assert f.d.item() == 1.0 and f.qs[0, 3] == 5 and f.qs[0, 19] == 10
    # Q4_K: get_scale_min_k4: sub-block 5's scale = low nibble of byte 9 | top bits of byte 1
    raw = torch.zeros(144, dtype=torch.uint8)
    raw[4 + 1] = 0b11_000000
    raw[4 + 9] = 0x7A  # scale 5 low nibble 0xA, min 5 low nibble 0x7
    raw[4 + 5] = 0b01_000011  # min 1 = 3, min 5 top bits 01
    raw[16 + 32 + 2] = 0x9C  # qs[32c + l] with c = 1, l = 2: w[66] = 0xC, w[98] = 0x9
    f = gb.unpack(raw, "Q4_K")
    assert f.scales[0].tolist() == [0, 0, 0, 0, 0, 0x3A, 0, 0]
    assert f.mins[0].tolist() == [0, 3, 0, 0, 0, 0x17, 0, 0]
    assert f.qs[0, 66] == 0xC and f.qs[0, 98] == 0x9
    # Q6_K: w[128h + 64n + l] from ql[64h + l], bits 4-5 from qh[32h + l] >> 2s, s = (w // 32) % 4
    raw = torch.zeros(210, dtype=torch.uint8)
    raw[64 + 5] = 0xF3  # h = 1, l = 5: w[133] low = 3, w[197] low = 0xF
    raw[128 + 32 + 5] = 0b11_00_00_10  # qh[32 + 5]: s = 0 -> 2 (w[133]), s = 3 -> 3 (w[229])
    f = gb.unpack(raw, "Q6_K")
    assert f.qs[0, 133] == (3 | 2 << 4) - 32 and f.qs[0, 197] == 0xF - 32
    assert f.qs[0, 229] == (3 << 4) - 32


@pytest.mark.parametrize("name", ["F16", "BF16", "Q4_0", "Q4_1", "Q5_1", "Q8_0", "IQ4_NL"])
def test_every_fp16_pattern(name):
    """All 65536 fp16 patterns (zeros, subnormals, infinities, NaNs with their payloads) as the
    value of F16/BF16 or the scale of a 32-weight type: still bit for bit."""
    size = gb.QUANT_SIZES[gb.GGMLType[name]][1]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (1 << 16, size), dtype=np.uint8)
    pattern = np.arange(1 << 16, dtype=np.uint16)
    if name != "BF16":
        for i, at in enumerate(HALVES[name]):
            raw[:, at:at + 2] = np.roll(pattern, 12345 * i).view(np.uint8).reshape(-1, 2)
    else:
        raw[:] = pattern.view(np.uint8).reshape(-1, 2)
    assert torch.equal(bits(gb.dequantize(raw, name)), bits(reference(raw, name)))


@pytest.mark.parametrize("name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
def test_special_fp16_scales_of_k_quants(name):
    """Every fp16 pattern with exponent field 0 or 31 (zeros, subnormals, inf, NaN) as d, and
    as dmin beside a finite d: bit for bit. With both special, where two NaNs meet (both NaN,
    or dmin inf times a zero min beside a NaN d) only NaN-ness is promised (module docstring)."""
    size = gb.QUANT_SIZES[gb.GGMLType[name]][1]
    rng = np.random.default_rng(2)
    special = np.concatenate([np.arange(0x400), np.arange(0x7C00, 0x8400),
                              np.arange(0xFC00, 0x10000)]).astype(np.uint16)
    halves = HALVES[name]
    n = special.size * len(halves)
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for i in range(len(halves)):  # block group i: field i special, the others finite
        for j, other in enumerate(halves):
            part = special if i == j else finite_halves(rng, special.size)
            rows = slice(i * special.size, (i + 1) * special.size)
            raw[rows, other:other + 2] = part.view(np.uint8).reshape(-1, 2)
    assert torch.equal(bits(gb.dequantize(raw, name)), bits(reference(raw, name)))
    if len(halves) == 1:
        return
    for at in halves:  # both special
        raw[:, at:at + 2] = rng.permutation(np.tile(special, len(halves))).view(
            np.uint8).reshape(-1, 2)
    got, expected = gb.dequantize(raw, name), torch.from_numpy(reference(raw, name).reshape(-1))
    assert torch.equal(got.isnan(), expected.isnan())
    kept = ~expected.isnan()
    assert torch.equal(bits(got[kept]), bits(expected[kept]))


@pytest.mark.parametrize("name", ["Q4_1", "Q4_K", "Q4_0", "Q5_0", "Q5_1"])
def test_affine_groups_rebuild_dequantize(name):
    raw = covering_blocks(name, seed=3)
    if name in ("Q4_0", "Q5_0"):  # the zero-sign cases the docstring names: d = +0, -0, d < 0
        raw[:4, 0:2] = np.array([0x0000, 0x8000, 0xBC00, 0x3C00], np.uint16).view(
            np.uint8).reshape(4, 2)
    rows, cols = 8, N_BLOCKS * gb.QUANT_SIZES[gb.GGMLType[name]][0] // 8
    q, scale, low = gb.affine_groups(torch.from_numpy(raw), name, (rows, cols))
    top = 31 if name.startswith("Q5") else 15
    assert q.dtype == torch.uint8 and q.shape == (rows, cols) and int(q.max()) == top
    assert scale.dtype == low.dtype == torch.float32
    assert scale.shape == low.shape == (rows, cols // 32)
    rebuilt = (scale.repeat_interleave(32, 1) * q.float()) + low.repeat_interleave(32, 1)
    expected = gb.dequantize(raw, name, (rows, cols))
    assert torch.equal(bits(expected), bits(reference(raw, name)))
    if name not in ("Q4_0", "Q5_0"):
        assert torch.equal(bits(rebuilt), bits(expected))
        return
    assert torch.equal(rebuilt, expected)  # == on values: -0.0 == +0.0
    differ = bits(rebuilt) != bits(expected)
    assert differ.any()  # the cases above do occur ...
    assert (expected.reshape(-1)[differ] == 0).all()  # ... and are only the sign of a zero
    assert (rebuilt.reshape(-1)[differ].view(torch.int32) == 0).all()  # +0.0


@pytest.mark.parametrize("name", ["Q8_0", "IQ4_NL", "IQ4_XS"])
def test_symmetric_int8_groups_rebuild_dequantize(name):
    raw = covering_blocks(name, seed=4)
    cols = N_BLOCKS * gb.QUANT_SIZES[gb.GGMLType[name]][0] // 16
    q, scale = gb.symmetric_int8_groups(raw, name, (16, cols))
    assert q.dtype == torch.int8 and q.shape == (16, cols)
    assert scale.dtype == torch.float32 and scale.shape == (16, cols // 32)
    rebuilt = scale.repeat_interleave(32, 1) * q.float()
    assert torch.equal(bits(rebuilt), bits(reference(raw, name)))


@pytest.mark.parametrize("name", ["Q6_K", "Q3_K", "Q5_0", "Q4_0"])
def test_symmetric_6bit_groups_rebuild_dequantize(name):
    raw = covering_blocks(name, seed=5)
    rows, cols = 8, N_BLOCKS * gb.QUANT_SIZES[gb.GGMLType[name]][0] // 8
    q, scale = gb.symmetric_6bit_groups(torch.from_numpy(raw), name, (rows, cols))
    assert q.dtype == torch.int8 and q.shape == (rows, cols)
    assert int(q.min()) >= -32 and int(q.max()) <= 31
    assert scale.dtype == torch.float32 and scale.shape == (rows, cols // 16)
    rebuilt = scale.repeat_interleave(16, 1) * q.float()
    expected = torch.from_numpy(reference(raw, name)).reshape(rows, cols)
    if name == "Q4_0":  # equal values; bits up to the sign of a zero (affine_groups' test)
        assert torch.equal(rebuilt, expected)
    else:
        assert torch.equal(bits(rebuilt), bits(expected))


def test_group_forms_refuse_other_types_and_shapes():
    with pytest.raises(ValueError):
        gb.affine_groups(covering_blocks("Q6_K", n=256), "Q6_K", (256, 256))
    with pytest.raises(ValueError):
        gb.symmetric_int8_groups(covering_blocks("Q4_0", n=256), "Q4_0", (256, 32))
    with pytest.raises(ValueError):
        gb.symmetric_6bit_groups(covering_blocks("Q4_K", n=256), "Q4_K", (256, 256))
    with pytest.raises(ValueError):  # Q4_K rows are whole 256-weight blocks
        gb.affine_groups(covering_blocks("Q4_K", n=256), "Q4_K", (512, 128))
    with pytest.raises(ValueError):
        gb.dequantize(covering_blocks("Q4_0", n=256), "Q4_0", (100, 100))
    with pytest.raises(ValueError):
        gb.unpack(np.zeros(17, np.uint8), "Q4_0")


ROUND_TRIP = {"F32": 0.0, "F16": None, "BF16": None, "Q4_0": 1.0, "Q4_1": 0.5, "Q5_0": 1.0,
              "Q5_1": 0.5, "Q8_0": 0.5}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_round_trip_of_tensors_gguf_quantizes(name):
    """A weight-like tensor quantized by the gguf package: our dequantize equals its dequantize
    bit for bit and lies within the format's rounding of the original (half a step; a whole step
    where ggml's symmetric types clip the value of largest magnitude's opposite)."""
    rng = np.random.default_rng(5)
    rows, cols = 96, 512
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.001, 3, (rows, 1))).astype(np.float32)
    w[0, :32] = 0.0  # an all-zero block (d = 0)
    w[1, :32] = 7.25  # a constant block
    qtype = GGMLQuantizationType[name]
    raw = gguf_quantize(w, qtype)
    ours = gb.dequantize(raw.reshape(-1).view(np.uint8), name, (rows, cols))
    assert torch.equal(bits(ours), bits(reference(raw, name).reshape(rows, cols)))
    error = (ours - torch.from_numpy(w)).abs()
    steps = ROUND_TRIP[name]
    if steps is None:  # F16 / BF16: one rounding to nearest
        eps = 2.0 ** -11 if name == "F16" else 2.0 ** -8
        assert (error <= torch.from_numpy(np.abs(w)) * eps + 2.0 ** -25).all()
        return
    f = gb.unpack(raw.reshape(-1).view(np.uint8), name)
    if name == "F32":
        assert torch.equal(ours, torch.from_numpy(w))
        return
    d = f.d.abs().reshape(rows, cols // 32).repeat_interleave(32, 1)
    # fp16 rounding of d (times up to 127 steps for Q8_0, 31 for the others) and of m
    slack = d * (128 if name == "Q8_0" else 32) * 2.0 ** -11
    if hasattr(f, "m"):
        slack = slack + f.m.abs().reshape(rows, -1).repeat_interleave(32, 1) * 2.0 ** -11
    assert (error <= d * steps + slack + 1e-7).all()
    if name in ("Q4_0", "Q4_1"):
        q, scale, low = gb.affine_groups(raw, name, (rows, cols))
        rebuilt = scale.repeat_interleave(32, 1) * q.float() + low.repeat_interleave(32, 1)
        assert torch.equal(rebuilt, ours)
    if name == "Q8_0":
        q, scale = gb.symmetric_int8_groups(raw, name, (rows, cols))
        assert torch.equal(bits(scale.repeat_interleave(32, 1) * q.float()), bits(ours))


def test_module_is_a_kernel_leaf():
    """It imports torch, numpy and the standard library only: nothing of radixflow's runtime or
    DSL, and not the gguf package (whose tables it mirrors)."""
    path = Path(gb.__file__)
    assert path.parts[-2:] == ("kernels", "gguf_blocks.py")
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "enum", "warnings", "typing", "numpy", "torch"}, imported
    code = ("import sys, radixflow.kernels.gguf_blocks; "
            "bad = [m for m in sys.modules if m.startswith(('radixflow.runtime', 'gguf', "
            "'radixflow.lang', 'radixflow.api'))]; print(bad); assert not bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
