"""GGUF's quantized block formats in torch: the reference every GGUF repacking path checks against.

Vectorised over any number of blocks (no Python loop per block), on any device, for F32, F16,
BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS. This module
is a kernel leaf: it imports torch, numpy and the standard library only, not the `gguf` package
(its tables are mirrored here and checked against it in the tests). Little-endian data.

Layouts (ggml-common.h / ggml-quants.c; the `gguf` package's quants.py decodes the same bytes).
"w[i]" is the i-th weight of a block, d/dmin/m are fp16, everything else is bytes:

- Q4_0 (32 weights, 18 bytes): d, qs[16]: w[j] = qs[j] & 15, w[j+16] = qs[j] >> 4;
  x = d * (q - 8).
- Q4_1 (32, 20): d, m, qs[16] as Q4_0; x = d * q + m.
- Q5_0 (32, 22): d, qh[4] (a u32: bit j is w[j]'s fifth bit), qs[16] as Q4_0; x = d * (q - 16).
- Q5_1 (32, 24): d, m, qh[4], qs[16] as Q5_0; x = d * q + m.
- Q8_0 (32, 34): d, qs[32] int8; x = q * d.
- Q2_K (256, 84): scales[16] (low nibble the scale, high nibble the min, per 16 weights),
  qs[64] (w[128h + 32s + l] = qs[32h + l] >> 2s & 3), d, dmin; x = (d*sc) * q - (dmin*mn).
- Q3_K (256, 110): hmask[32] (w[32b + l]'s bit is bit b of hmask[l]), qs[64] as Q2_K,
  scales[12] (16 six-bit scales: low nibbles in bytes 0-7 as Q4_0's order, two-bit highs in
  bytes 8-11 by shifts 0, 2, 4, 6), d; q = ql - 4 where the hmask bit is 0, else ql (-4..3);
  x = (d * (sc - 32)) * q.
- Q4_K (256, 144): d, dmin, scales[12] (get_scale_min_k4: 8 six-bit scales and 8 six-bit mins,
  one pair per 32 weights), qs[128] (w[64c + 32n + l] = qs[32c + l] >> 4n & 15);
  x = (d*sc) * q - (dmin*mn).
- Q5_K (256, 176): d, dmin, scales[12] as Q4_K, qh[32] (w[32b + l]'s fifth bit is bit b of
  qh[l]), qs[128] as Q4_K; x = (d*sc) * q - (dmin*mn), q in 0..31.
- Q6_K (256, 210): ql[128] (w[128h + 64n + l] = ql[64h + l] >> 4n & 15), qh[64] (bits 4-5 of
  w[128h + 32s + l] are qh[32h + l] >> 2s & 3), scales[16] int8 per 16 weights, d;
  x = (d * sc) * (q - 32).
- IQ4_NL (32, 18): d, qs[16] as Q4_0, indices into KVALUES_IQ4NL; x = d * kvalues[q].
- IQ4_XS (256, 136): d, scales_h (a u16: bits 2j, 2j+1 are bits 4-5 of sub-block j's scale),
  scales_l[4] (nibble j, low first: bits 0-3), qs[128] (w[32j + 16n + l] = qs[16j + l] >> 4n
  & 15); x = (d * (sc - 32)) * kvalues[q], sub-blocks of 32.
- F32, F16, BF16 (1 weight; 4, 2, 2 bytes): the value.

What each function guarantees:

- `unpack(raw, qtype)` -> a NamedTuple of the block's fields (`Q4KFields` etc.; `FIELDS` maps each
  type to its class): fp16 scalars as float32 [n_blocks] (converted bit-exactly, NaN payloads
  kept, as numpy converts), per-sub-block scales/mins [n_blocks, k], quants [n_blocks, block] in
  the order of the weights (uint8 codes; int8 where ggml's value is signed: Q8_0, Q3_K's -4..3 and
  its scales minus 32, Q6_K's q - 32 and scales, IQ4_XS's scales minus 32). F32/F16/BF16 give
  their values in the stored dtype (bits untouched).
- `dequantize(raw, qtype, shape)` -> float32 `shape`, with ggml's float32 operations in ggml's
  order (the formulas above): equal to `gguf.quants.dequantize` bit for bit for every block
  whose fp16 fields are finite (ggml's quantizers write nothing else), whatever its other bytes.
  With inf/NaN fields the outputs are NaN exactly where gguf's are, with gguf's bits where one
  NaN propagates (on the CPU); where two NaNs meet (Q2_K/Q4_K/Q5_K's d*sc*q - dmin*mn with both
  scales NaN, or dmin inf times a zero min), which payload survives is the machine's choice
  (numpy keeps the first operand's, torch's CPU kernels the second's; CUDA gives its canonical
  NaN).
- `symmetric_6bit_groups(raw, qtype, shape)` for Q6_K, Q3_K, Q5_0, Q4_0 -> (q int8 in
  -32..31, scale float32 per 16 weights) with `scale * q` equal to `dequantize` bit for bit
  (Q4_0: equal values, as in affine_groups).
- `q4_k_fields(raw, shape)`: Q4_K's fields per row as stored (the tiled q4_k format's input).
- `affine_groups(raw, qtype, shape)` for Q4_0, Q4_1, Q4_K, Q5_0, Q5_1 -> (q uint8 [rows, cols]
  in 0..15 (Q5_*: 0..31), scale, low float32 [rows, cols/32]) with `scale * q + low` (float32:
  the product, then the sum) equal to `dequantize` bit for bit for Q4_1 and Q5_1 (scale = d, low
  = m) and Q4_K (scale = d*sc, low = -(dmin*mn); x - y is x + (-y) in IEEE arithmetic). Q4_0
  (scale = d, low = d * -8) and Q5_0 (low = d * -16): every product and sum is exact (fp16 d
  times a 4- or 5-bit integer needs at most 16 significant bits), so
  the values are equal (==) everywhere for finite d; the bits differ only in the sign of an
  exact zero (ggml's d * (q - 8) is -0.0 for d < 0 at q = 8, d = +0 at q < 8 and d = -0 at
  q >= 8, where d*q + low gives +0.0): a dot product sees it only as the sign of a zero sum.
- `symmetric_int8_groups(raw, "Q8_0", shape)` -> (q int8 [rows, cols], scale float32
  [rows, cols/32]) with `scale * q` equal to `dequantize` bit for bit.
"""

from __future__ import annotations

import enum
import warnings
from typing import NamedTuple

import numpy as np
import torch

QK_K = 256
GROUP = 32  # the group of input features radixflow's int4/int8 kernels scale together


class GGMLType(enum.IntEnum):
    """ggml's type ids (ggml.h's enum ggml_type) for the types this module reads."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23
    BF16 = 30


# (weights per block, bytes per block): mirrors gguf.constants.GGML_QUANT_SIZES (a test checks).
QUANT_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18),
    GGMLType.Q4_1: (32, 20),
    GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q2_K: (256, 84),
    GGMLType.Q3_K: (256, 110),
    GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176),
    GGMLType.Q6_K: (256, 210),
    GGMLType.IQ4_NL: (32, 18),
    GGMLType.IQ4_XS: (256, 136),
}

# IQ4_NL / IQ4_XS's non-linear 4-bit values (ggml-common.h kvalues_iq4nl).
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


# ---------------------------------------------------------------------------------------------
# Fields


class FloatFields(NamedTuple):
    values: torch.Tensor  # [n] float32 / float16 / bfloat16 as stored


class Q4_0Fields(NamedTuple):
    d: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] uint8 0..15; x = d * (q - 8)


class Q4_1Fields(NamedTuple):
    d: torch.Tensor  # [n] float32
    m: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] uint8 0..15; x = d * q + m


class Q5_0Fields(NamedTuple):
    d: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] uint8 0..31; x = d * (q - 16)


class Q5_1Fields(NamedTuple):
    d: torch.Tensor  # [n] float32
    m: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] uint8 0..31; x = d * q + m


class Q8_0Fields(NamedTuple):
    d: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] int8; x = q * d


class Q2KFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    dmin: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 16] uint8 0..15, one per 16 weights
    mins: torch.Tensor  # [n, 16] uint8 0..15
    qs: torch.Tensor  # [n, 256] uint8 0..3; x = (d * sc) * q - dmin * mn


class Q3KFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 16] int8 -32..31 (the six-bit field minus 32), per 16 weights
    qs: torch.Tensor  # [n, 256] int8 -4..3; x = (d * sc) * q


class Q4KFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    dmin: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 8] uint8 0..63, one per 32 weights
    mins: torch.Tensor  # [n, 8] uint8 0..63
    qs: torch.Tensor  # [n, 256] uint8 0..15; x = (d * sc) * q - dmin * mn


class Q5KFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    dmin: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 8] uint8 0..63
    mins: torch.Tensor  # [n, 8] uint8 0..63
    qs: torch.Tensor  # [n, 256] uint8 0..31; x = (d * sc) * q - dmin * mn


class Q6KFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 16] int8, per 16 weights
    qs: torch.Tensor  # [n, 256] int8 -32..31; x = (d * sc) * q


class IQ4NLFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    qs: torch.Tensor  # [n, 32] uint8 0..15, indices into KVALUES_IQ4NL; x = d * kvalues[q]


class IQ4XSFields(NamedTuple):
    d: torch.Tensor  # [n] float32
    scales: torch.Tensor  # [n, 8] int8 -32..31 (six-bit field minus 32), per 32 weights
    qs: torch.Tensor  # [n, 256] uint8 0..15 indices; x = (d * sc) * kvalues[q]


FIELDS: dict[GGMLType, type] = {
    GGMLType.F32: FloatFields, GGMLType.F16: FloatFields, GGMLType.BF16: FloatFields,
    GGMLType.Q4_0: Q4_0Fields, GGMLType.Q4_1: Q4_1Fields, GGMLType.Q5_0: Q5_0Fields,
    GGMLType.Q5_1: Q5_1Fields, GGMLType.Q8_0: Q8_0Fields, GGMLType.Q2_K: Q2KFields,
    GGMLType.Q3_K: Q3KFields, GGMLType.Q4_K: Q4KFields, GGMLType.Q5_K: Q5KFields,
    GGMLType.Q6_K: Q6KFields, GGMLType.IQ4_NL: IQ4NLFields, GGMLType.IQ4_XS: IQ4XSFields,
}


# ---------------------------------------------------------------------------------------------
# Helpers


def ggml_type(qtype) -> GGMLType:
    """A GGMLType from one (gguf's GGMLQuantizationType is an IntEnum with the same ids), an int
    id or a name ("Q4_K")."""
    if isinstance(qtype, str):
        try:
            return GGMLType[qtype.upper()]
        except KeyError:
            raise ValueError(f"GGUF type {qtype!r} is not one this module reads") from None
    try:
        return GGMLType(int(qtype))
    except ValueError:
        name = getattr(qtype, "name", qtype)
        raise ValueError(f"GGUF type {name} is not one this module reads") from None


def row_bytes(qtype, cols: int) -> int:
    """Bytes of one row of `cols` weights."""
    block, size = QUANT_SIZES[ggml_type(qtype)]
    if cols % block:
        raise ValueError(f"{ggml_type(qtype).name} rows hold multiples of {block} weights, "
                         f"not {cols}")
    return cols // block * size


def _as_blocks(raw, qtype: GGMLType) -> torch.Tensor:
    """raw (torch or numpy, any dtype: its bytes are read) -> uint8 [n_blocks, type_size]."""
    if isinstance(raw, np.ndarray):
        with warnings.catch_warnings():  # a read-only memmap: nothing here writes to it
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.ascontiguousarray(raw))
    if raw.dtype != torch.uint8:
        raw = raw.contiguous().view(torch.uint8)
    size = QUANT_SIZES[qtype][1]
    if raw.numel() % size:
        raise ValueError(f"{raw.numel()} bytes are not whole {qtype.name} blocks of {size}")
    return raw.reshape(-1, size)


def _spread(b: torch.Tensor, chunk: int, shifts: tuple[int, ...], mask: int) -> torch.Tensor:
    """ggml's bit-field order: for each run of `chunk` bytes, each shift in turn over the run.
    b [n, k] uint8 -> [n, k * len(shifts)] uint8: ((b[run, :] >> shift) & mask) for run, shift."""
    n = b.shape[0]
    s = torch.tensor(shifts, dtype=torch.uint8, device=b.device).view(1, 1, -1, 1)
    return ((b.reshape(n, -1, 1, chunk) >> s) & mask).reshape(n, -1)


def _f16_to_f32(h: torch.Tensor) -> torch.Tensor:
    """float16 -> float32, exactly, NaN payloads kept (signalling NaNs stay signalling) as numpy's
    astype does; torch's own conversion quiets them."""
    bits = h.contiguous().view(torch.int16).to(torch.int32)  # sign-extended
    nan = (bits & 0x7FFF) > 0x7C00
    kept = ((bits & 0x7FFF) << 13) | 0x7F800000
    kept = torch.where(bits < 0, kept | -(2 ** 31), kept)
    return torch.where(nan, kept, h.float().view(torch.int32)).view(torch.float32)


def _half(b: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at bytes start..start+1 of each block, as float32 [n]."""
    return _f16_to_f32(b[:, start:start + 2].contiguous().view(torch.float16).reshape(-1))


def _scale_min_k4(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """get_scale_min_k4 over [n, 12] bytes -> (scales, mins) [n, 8] uint8 0..63."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = torch.cat([d & 63, (md & 15) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scales, mins


def _kvalues(device) -> torch.Tensor:
    return torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=device)


# ---------------------------------------------------------------------------------------------
# unpack


def unpack(raw, qtype):
    """raw bytes (uint8 [n_blocks, type_size] or flat; numpy or torch) -> the type's fields."""
    t = ggml_type(qtype)
    b = _as_blocks(raw, t)
    if t == GGMLType.F32:
        return FloatFields(b.view(torch.float32).reshape(-1))
    if t == GGMLType.F16:
        return FloatFields(b.view(torch.float16).reshape(-1))
    if t == GGMLType.BF16:
        return FloatFields(b.view(torch.bfloat16).reshape(-1))
    if t in (GGMLType.Q4_0, GGMLType.IQ4_NL):
        qs = _spread(b[:, 2:18], 16, (0, 4), 15)
        return (Q4_0Fields if t == GGMLType.Q4_0 else IQ4NLFields)(_half(b, 0), qs)
    if t == GGMLType.Q4_1:
        return Q4_1Fields(_half(b, 0), _half(b, 2), _spread(b[:, 4:20], 16, (0, 4), 15))
    if t in (GGMLType.Q5_0, GGMLType.Q5_1):
        at = 2 if t == GGMLType.Q5_0 else 4
        qh = _spread(b[:, at:at + 4], 1, tuple(range(8)), 1)
        qs = _spread(b[:, at + 4:at + 20], 16, (0, 4), 15) | (qh << 4)
        if t == GGMLType.Q5_0:
            return Q5_0Fields(_half(b, 0), qs)
        return Q5_1Fields(_half(b, 0), _half(b, 2), qs)
    if t == GGMLType.Q8_0:
        return Q8_0Fields(_half(b, 0), b[:, 2:34].contiguous().view(torch.int8))
    if t == GGMLType.Q2_K:
        sc = b[:, 0:16]
        return Q2KFields(_half(b, 80), _half(b, 82), sc & 15, sc >> 4,
                         _spread(b[:, 16:80], 32, (0, 2, 4, 6), 3))
    if t == GGMLType.Q3_K:
        high = _spread(b[:, 0:32], 32, tuple(range(8)), 1)
        low = _spread(b[:, 32:96], 32, (0, 2, 4, 6), 3)
        qs = low.to(torch.int8) - ((high ^ 1) << 2).to(torch.int8)
        s = b[:, 96:108]
        scales = _spread(s[:, 0:8], 8, (0, 4), 15) | (_spread(s[:, 8:12], 4, (0, 2, 4, 6), 3) << 4)
        return Q3KFields(_half(b, 108), scales.to(torch.int8) - 32, qs)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        scales, mins = _scale_min_k4(b[:, 4:16])
        if t == GGMLType.Q4_K:
            return Q4KFields(_half(b, 0), _half(b, 2), scales, mins,
                             _spread(b[:, 16:144], 32, (0, 4), 15))
        qh = _spread(b[:, 16:48], 32, tuple(range(8)), 1)
        qs = _spread(b[:, 48:176], 32, (0, 4), 15) | (qh << 4)
        return Q5KFields(_half(b, 0), _half(b, 2), scales, mins, qs)
    if t == GGMLType.Q6_K:
        low = _spread(b[:, 0:128], 64, (0, 4), 15)
        high = _spread(b[:, 128:192], 32, (0, 2, 4, 6), 3)
        qs = (low | (high << 4)).to(torch.int8) - 32
        return Q6KFields(_half(b, 208), b[:, 192:208].contiguous().view(torch.int8), qs)
    if t == GGMLType.IQ4_XS:
        low = _spread(b[:, 4:8], 1, (0, 4), 15)
        high = _spread(b[:, 2:4], 1, (0, 2, 4, 6), 3)
        scales = (low | (high << 4)).to(torch.int8) - 32
        return IQ4XSFields(_half(b, 0), scales, _spread(b[:, 8:136], 16, (0, 4), 15))
    raise AssertionError(t)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# dequantize


def _blocks_f32(f, t: GGMLType) -> torch.Tensor:
    """float32 [n_blocks, block_size], ggml's operations in ggml's order (gguf's quants.py)."""
    if t == GGMLType.F32:
        return f.values.unsqueeze(1)
    if t == GGMLType.F16:
        return _f16_to_f32(f.values).unsqueeze(1)
    if t == GGMLType.BF16:
        bits = f.values.contiguous().view(torch.int16).to(torch.int32) * 65536
        return bits.view(torch.float32).unsqueeze(1)
    d = f.d.unsqueeze(1)
    n = f.d.shape[0]
    if t == GGMLType.Q4_0:
        return d * (f.qs.to(torch.int8) - 8).float()
    if t == GGMLType.Q5_0:
        return d * (f.qs.to(torch.int8) - 16).float()
    if t in (GGMLType.Q4_1, GGMLType.Q5_1):
        return d * f.qs.float() + f.m.unsqueeze(1)
    if t == GGMLType.Q8_0:
        return f.qs.float() * d
    if t == GGMLType.IQ4_NL:
        return d * _kvalues(f.qs.device)[f.qs.long()]
    if t == GGMLType.Q2_K:
        dl = (d * f.scales.float()).unsqueeze(-1)
        ml = (f.dmin.unsqueeze(1) * f.mins.float()).unsqueeze(-1)
        return (dl * f.qs.float().view(n, 16, 16) - ml).view(n, QK_K)
    if t in (GGMLType.Q3_K, GGMLType.Q6_K):
        dl = (d * f.scales.float()).unsqueeze(-1)
        return (dl * f.qs.float().view(n, 16, 16)).view(n, QK_K)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        dl = (d * f.scales.float()).unsqueeze(-1)
        ml = (f.dmin.unsqueeze(1) * f.mins.float()).unsqueeze(-1)
        return (dl * f.qs.float().view(n, 8, 32) - ml).view(n, QK_K)
    if t == GGMLType.IQ4_XS:
        dl = (d * f.scales.float()).unsqueeze(-1)
        values = _kvalues(f.qs.device)[f.qs.long()]
        return (dl * values.view(n, 8, 32)).view(n, QK_K)
    raise AssertionError(t)  # pragma: no cover


def _shape(shape, numel: int) -> tuple[int, ...]:
    shape = (numel,) if shape is None else tuple(int(s) for s in shape)
    if int(np.prod(shape, dtype=np.int64)) != numel:
        raise ValueError(f"shape {shape} does not hold the {numel} weights of the data")
    return shape


def dequantize(raw, qtype, shape=None) -> torch.Tensor:
    """raw bytes -> float32 tensor of `shape` (flat when None), equal to
    gguf.quants.dequantize bit for bit."""
    t = ggml_type(qtype)
    x = _blocks_f32(unpack(raw, t), t)
    return x.reshape(_shape(shape, x.numel()))


# ---------------------------------------------------------------------------------------------
# The int4 / int8 kernels' group forms


def _rows_cols(shape, numel: int, t: GGMLType) -> tuple[int, int]:
    shape = _shape(shape, numel)
    cols = shape[-1]
    rows = numel // cols if cols else 0
    if cols % QUANT_SIZES[t][0]:
        raise ValueError(f"{t.name} rows hold multiples of {QUANT_SIZES[t][0]} weights, "
                         f"not {cols}")
    return rows, cols


def affine_groups(raw, qtype, shape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0 / Q4_1 / Q4_K / Q5_0 / Q5_1 -> (q uint8 [rows, cols] 0..15 (Q5_*: 0..31), scale,
    low float32 [rows, cols/32]) with scale * q + low == dequantize(raw, qtype, (rows, cols)):
    bit for bit for Q4_1, Q5_1 and Q4_K, equal values (bits up to the sign of an exact zero) for
    Q4_0 and Q5_0 (see the module docstring). rows, cols = prod(shape[:-1]), shape[-1]."""
    t = ggml_type(qtype)
    if t not in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q5_1):
        raise ValueError(f"affine_groups reads Q4_0, Q4_1, Q4_K, Q5_0 and Q5_1, not {t.name}")
    f = unpack(raw, t)
    rows, cols = _rows_cols(shape, f.qs.numel(), t)
    if t == GGMLType.Q4_K:
        scale = f.d.unsqueeze(1) * f.scales.float()
        low = -(f.dmin.unsqueeze(1) * f.mins.float())
    elif t in (GGMLType.Q4_1, GGMLType.Q5_1):
        scale, low = f.d, f.m
    else:
        scale, low = f.d, f.d * (-8.0 if t == GGMLType.Q4_0 else -16.0)
    return (f.qs.reshape(rows, cols), scale.reshape(rows, cols // GROUP),
            low.reshape(rows, cols // GROUP))


def symmetric_int8_groups(raw, qtype, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 / IQ4_NL / IQ4_XS -> (q int8 [rows, cols], scale float32 [rows, cols/32]) with
    scale * q == dequantize(raw, qtype, (rows, cols)) bit for bit: IQ4's 4-bit codes become
    their int8 values (KVALUES_IQ4NL), the scale d (IQ4_XS: d * sc per 32)."""
    t = ggml_type(qtype)
    if t not in (GGMLType.Q8_0, GGMLType.IQ4_NL, GGMLType.IQ4_XS):
        raise ValueError(f"symmetric_int8_groups reads Q8_0, IQ4_NL and IQ4_XS, not {t.name}")
    f = unpack(raw, t)
    if t == GGMLType.Q8_0:
        q, scale = f.qs, f.d
    else:
        q = torch.tensor(KVALUES_IQ4NL, dtype=torch.int8)[f.qs.long()]
        scale = f.d if t == GGMLType.IQ4_NL else f.d.unsqueeze(1) * f.scales.float()
    rows, cols = _rows_cols(shape, q.numel(), t)
    return q.reshape(rows, cols), scale.reshape(rows, cols // GROUP)


def q4_k_fields(raw, shape, qtype=GGMLType.Q4_K) -> tuple[torch.Tensor, ...]:
    """Q4_K's (Q5_K's) fields per row as stored (kernels.cpu.tile_q4_k's, tile_q5_k's
    arguments): q uint8 [rows, cols] in 0..15 (0..31), scales and mins uint8 [rows, cols/32]
    in 0..63, d and dmin float32 [rows, cols/256]; (d * scales) * q - (dmin * mins) ==
    dequantize(raw, qtype, (rows, cols))."""
    t = ggml_type(qtype)
    if t not in (GGMLType.Q4_K, GGMLType.Q5_K):
        raise ValueError(f"q4_k_fields reads Q4_K and Q5_K, not {t.name}")
    f = unpack(raw, t)
    rows, cols = _rows_cols(shape, f.qs.numel(), t)
    return (f.qs.reshape(rows, cols), f.scales.reshape(rows, cols // GROUP),
            f.mins.reshape(rows, cols // GROUP), f.d.reshape(rows, cols // QK_K),
            f.dmin.reshape(rows, cols // QK_K))


def q2_k_fields(raw, shape) -> tuple[torch.Tensor, ...]:
    """Q2_K's fields per row as stored (kernels.cpu.tile_q2_k's arguments): q uint8 [rows, cols]
    in 0..3, scales and mins uint8 [rows, cols/16] in 0..15, d and dmin float32 [rows,
    cols/256]; (d * scales) * q - dmin * mins == dequantize(raw, Q2_K, (rows, cols))."""
    f = unpack(raw, GGMLType.Q2_K)
    rows, cols = _rows_cols(shape, f.qs.numel(), GGMLType.Q2_K)
    return (f.qs.reshape(rows, cols), f.scales.reshape(rows, cols // SIX_BIT_GROUP),
            f.mins.reshape(rows, cols // SIX_BIT_GROUP), f.d.reshape(rows, cols // QK_K),
            f.dmin.reshape(rows, cols // QK_K))


def q3_k_fields(raw, shape) -> tuple[torch.Tensor, ...]:
    """Q3_K's fields per row as stored (kernels.cpu.tile_q3_k's arguments): q int8 [rows, cols]
    in -4..3, scales int8 [rows, cols/16] in -32..31 (the six-bit field minus 32), d float32
    [rows, cols/256]; (d * scales) * q == dequantize(raw, Q3_K, (rows, cols))."""
    f = unpack(raw, GGMLType.Q3_K)
    rows, cols = _rows_cols(shape, f.qs.numel(), GGMLType.Q3_K)
    return (f.qs.reshape(rows, cols), f.scales.reshape(rows, cols // SIX_BIT_GROUP),
            f.d.reshape(rows, cols // QK_K))


def iq4_fields(raw, qtype, shape) -> tuple[torch.Tensor, ...]:
    """IQ4_NL's / IQ4_XS's fields per row as stored (kernels.cpu.tile_iq4_nl's, tile_iq4_xs's
    arguments): q uint8 [rows, cols] indices in 0..15, then IQ4_NL: d float32 [rows, cols/32]
    (d * kvalues[q] == dequantize); IQ4_XS: scales int8 [rows, cols/32] in -32..31 and d float32
    [rows, cols/256] ((d * scales) * kvalues[q] == dequantize)."""
    t = ggml_type(qtype)
    if t not in (GGMLType.IQ4_NL, GGMLType.IQ4_XS):
        raise ValueError(f"iq4_fields reads IQ4_NL and IQ4_XS, not {t.name}")
    f = unpack(raw, t)
    rows, cols = _rows_cols(shape, f.qs.numel(), t)
    if t == GGMLType.IQ4_NL:
        return f.qs.reshape(rows, cols), f.d.reshape(rows, cols // GROUP)
    return (f.qs.reshape(rows, cols), f.scales.reshape(rows, cols // GROUP),
            f.d.reshape(rows, cols // QK_K))


def q6_k_fields(raw, shape) -> tuple[torch.Tensor, ...]:
    """Q6_K's fields per row as stored (kernels.cpu.tile_q6_k's arguments): q int8 [rows, cols]
    in -32..31, scales int8 [rows, cols/16], d float32 [rows, cols/256];
    (d * scales) * q == dequantize(raw, Q6_K, (rows, cols))."""
    f = unpack(raw, GGMLType.Q6_K)
    rows, cols = _rows_cols(shape, f.qs.numel(), GGMLType.Q6_K)
    return (f.qs.reshape(rows, cols), f.scales.reshape(rows, cols // SIX_BIT_GROUP),
            f.d.reshape(rows, cols // QK_K))


SIX_BIT_GROUP = 16  # weights per scale of the 6-bit symmetric form


def symmetric_6bit_groups(raw, qtype, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K / Q3_K / Q5_0 / Q4_0 -> (q int8 [rows, cols] in -32..31, scale float32
    [rows, cols/16]) with scale * q == dequantize(raw, qtype, (rows, cols)): bit for bit for
    Q6_K and Q3_K (scale ggml's d * sc, its (d * sc) * q) and Q5_0 (scale d: every d * (q - 16)
    is exact); for Q4_0 (scale d, q - 8) equal values, up to the sign of an exact zero (as
    affine_groups' Q4_0)."""
    t = ggml_type(qtype)
    if t not in (GGMLType.Q6_K, GGMLType.Q3_K, GGMLType.Q5_0, GGMLType.Q4_0):
        raise ValueError(f"symmetric_6bit_groups reads Q6_K, Q3_K, Q5_0 and Q4_0, not {t.name}")
    f = unpack(raw, t)
    if t in (GGMLType.Q5_0, GGMLType.Q4_0):
        q = f.qs.to(torch.int8) - (16 if t == GGMLType.Q5_0 else 8)
        scale = f.d.unsqueeze(1).expand(-1, GROUP // SIX_BIT_GROUP)
    else:
        q, scale = f.qs, f.d.unsqueeze(1) * f.scales.float()
    rows, cols = _rows_cols(shape, q.numel(), t)
    return q.reshape(rows, cols), scale.reshape(rows, cols // SIX_BIT_GROUP)


__all__ = ["FIELDS", "GROUP", "KVALUES_IQ4NL", "QK_K", "QUANT_SIZES", "SIX_BIT_GROUP",
           "GGMLType", "affine_groups", "dequantize", "ggml_type", "iq4_fields", "q2_k_fields",
           "q3_k_fields",
           "q4_k_fields", "q6_k_fields",
           "row_bytes", "symmetric_6bit_groups", "symmetric_int8_groups", "unpack"]
