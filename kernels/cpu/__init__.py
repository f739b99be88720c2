"""Radixflow's CPU kernels: weight-only matrix products for decode, and the fused decode step.

The C sources come in one build per instruction-set level (features.py says which this CPU
runs): gemv_<level>.c multiplies a few rows of x by weights in a tiled layout (16 output rows
side by side: see gemv_avx512.c's header comment) in fourteen formats: GGUF's Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS as stored (q4_0, q4_1, q5_0,
q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs), q6
(6-bit symmetric values with an fp16 scale per 16: GGUF's Q3_K), and bf16; step_<level>.c
holds the decode step's attention, SiLU and argmax, and a request's causal prefill attention
(prefill.py). gemm.c (Python's entry points to the products) and decode.c are the same at
every level: decode.c runs a whole decode step of a Llama-family model (a batch of requests,
one token each) over those weights (see runtime/models/cpu_decode.py), and splits a prefill's
attention into tiles over threads (each level's step file computes a tile); rows.c (rows.py)
holds an extend forward's per-token vector work (residual add + RMSNorm, rope, SiLU * up), one
pass each.
- avx512: the integer formats multiply with VNNI after splitting x per group of 32 into exact
  16-bit integers; bf16 with vdpbf16ps; attention in bf16 dot products.
- avx2: x is quantized to int8 per group of 32 (as llama.cpp does on AVX2) and multiplied with
  vpmaddubsw; bf16 weights widened to fp32; attention in fp32 arithmetic over bf16 K/V.
Each level's build is compiled once per machine with the system C compiler into the radixflow
cache folder and loaded with ctypes (build.py; no torch headers, so the build is short). At
the generic level, or with no compiler, `available()` is False and callers keep their torch
path.

Each format has a torch reference (`unpack` + matmul) that the tests compare against.

Products of many rows (a prefill) are faster through oneDNN's GEMM than through the tiled
kernels: `gemm_dequant` dequantizes a block of output rows at a time (rf_dequant_rows, each
level's `rf_dequant_tiles`: bit for bit `unpack`, rounded to bf16 as torch rounds) into a
reused scratch buffer and multiplies it with torch.mm, so no dense copy of the weights is kept.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from dataclasses import dataclass, field

import torch

from ..gguf_blocks import KVALUES_IQ4NL
from . import abi, build
from .features import cpu_features

TILE = 16
GROUP = 32
MAX_GROUPS = 1024  # in_features / 32 per weight


_batch_int8_rows = 3  # (gemm.c's default)
# the formats whose products take x as int8 from one row on while batch int8 is on (gemv.h's
# split_mode: their 16-bit products are compute-bound)
INT8_X_FROM_ONE_ROW = ("q5_0", "q5_1", "q5_k", "q6", "q6_k", "q3_k", "q2_k")
_levels_loaded: set[str] = set()  # the levels _library_for was asked for


@functools.cache
def _library_for(level: str) -> ctypes.CDLL | None:
    _levels_loaded.add(level)
    lib = build.load(level, TILE, GROUP)
    if lib is not None:
        lib.rf_set_batch_int8_rows(_batch_int8_rows)
    return lib


def set_batch_int8_rows(rows: int) -> None:
    """From how many rows of x the avx512 build's q4_1/q4_k products take x as int8 per
    group of 32 (one vpdpbusd a weight byte, llama.cpp's precision) instead of exact 16-bit
    integers (two): a batch's decode step is then ~1.7x faster, and its outputs differ from
    each request's alone by that rounding; INT8_X_FROM_ONE_ROW take int8 x from one row on
    while this is above 0 (gemv.h's split_mode); 0: never (the products batch-invariant). For
    every build this process has loaded or loads later (`--cpu-batch-int8-rows`)."""
    global _batch_int8_rows
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    _batch_int8_rows = rows
    for level in list(_levels_loaded):
        lib = _library_for(level)
        if lib is not None:
            lib.rf_set_batch_int8_rows(rows)


def batch_int8_rows() -> int:
    return _batch_int8_rows


@contextlib.contextmanager
def batch_int8_by_requests(num_requests: int, rows: int):
    """Decide the products' x precision by the requests in a step, not its rows: a step of
    fewer requests than set_batch_int8_rows' threshold keeps exact 16-bit x however many rows
    it has (a speculative verify pass: a request's drafted tokens are rows of their own), so
    each request gets the logits it would get decoding alone, token for token."""
    threshold = _batch_int8_rows
    if not (threshold > 0 and num_requests < threshold <= rows):
        yield
        return
    set_batch_int8_rows(1 << 30)  # (> 0: the formats that take int8 x from one row still do)
    try:
        yield
    finally:
        set_batch_int8_rows(threshold)


def _library(at: str | None = None) -> ctypes.CDLL | None:
    """The build of level `at`, by default the level in force (features.cpu_features); None
    where it cannot load."""
    if os.environ.get("RADIXFLOW_DISABLE_CPU_KERNELS"):
        return None
    at = at or cpu_features().kernel_level
    return None if at is None else _library_for(at)


def limits(at: str | None = None) -> abi.Limits | None:
    """The limits the build of level `at` (default: the level in force) was compiled with."""
    lib = _library(at)
    return None if lib is None else lib.rf_limits


def available() -> bool:
    return _library() is not None


def active_level() -> str | None:
    """The level whose kernels run ("avx512", "avx2"), or None (torch's kernels only)."""
    return cpu_features().kernel_level if available() else None


# ---- weights ----

@dataclass
class Q8_0Weight:
    """Row-major symmetric int8 groups of 32 (GGUF's Q8_0): w = q * scale."""

    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]


def quantize_q8_0(weight: torch.Tensor) -> Q8_0Weight:
    """Exact for weights that came from Q8_0."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP, GROUP)
    scale = groups.abs().amax(-1) / 127
    q = (groups / scale.clamp(min=1e-30)[..., None]).round().clamp(-127, 127)
    return Q8_0Weight(q.to(torch.int8).view(n, k).contiguous(), scale.contiguous())


def unpack_q8_0(w: Q8_0Weight) -> torch.Tensor:
    n, k = w.shape
    return (w.q.float().view(n, k // GROUP, GROUP) * w.scale[..., None]).view(n, k)


@dataclass
class TiledWeight:
    """Weights [n, k] in one of the tiled layouts (gemv_avx512.c): 16 output rows side by side.
    The layouts are the same at every level; `level` is the build that multiplies them, the
    one in force when they were tiled (so a model keeps the kernels it was loaded with)."""

    format: str  # q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6 q6_k q8_0 iq4_nl iq4_xs bf16
    data: torch.Tensor  # uint8, [tiles, ...]
    n: int
    k: int
    level: str | None = field(default_factory=lambda: active_level())

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.k

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def _check_weight_shape(n: int, k: int, group: int) -> None:
    if k % group:
        raise ValueError(f"in_features must be a multiple of {group}, got {k}")
    if k // GROUP > MAX_GROUPS:
        raise ValueError(f"in_features over {MAX_GROUPS * GROUP} is not supported, got {k}")


def _pad_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    pad = -n % TILE
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t


def tile_q4_1(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> TiledWeight:
    """q [N, K] in 0..15, scale and low [N, K / 32]: w = low + q * scale, the scales held as
    fp16 (GGUF's Q4_1 stores them so; `unpack` shows what was kept)."""
    n, k = q.shape
    _check_weight_shape(n, k, GROUP)
    g = k // GROUP
    q = _pad_rows(q.to(torch.uint8), n)
    tiles = q.shape[0] // TILE
    # [tile, row, group, chunk, half, i] (k = 8 chunk + 4 half + i)
    #   -> [tile, group, chunk, row, i, half]
    q = q.view(tiles, TILE, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    nibbles = q[..., 0] | (q[..., 1] << 4)

    def scales(s: torch.Tensor) -> torch.Tensor:
        s = _pad_rows(s.to(torch.float16), n).view(tiles, TILE, g).transpose(1, 2)
        return s.contiguous().view(torch.uint8)  # [tiles, g, 32]

    data = torch.cat([scales(scale), scales(low), nibbles.reshape(tiles, g, 256)], dim=-1)
    return TiledWeight("q4_1", data.contiguous(), n, k)


def tile_q4_0(q: torch.Tensor, scale: torch.Tensor) -> TiledWeight:
    """GGUF's Q4_0 as stored: q [N, K] in 0..15, scale [N, K / 32] fp16 values d; w = d (q - 8).
    Per tile and group: fp16 d[16], then the nibbles as q4_1 holds them (4.5 bits a weight)."""
    n, k = q.shape
    if scale.shape != (n, k // GROUP):
        raise ValueError(f"expected scale of shape [{n}, {k // GROUP}], got {tuple(scale.shape)}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise ValueError("4-bit weights must be in 0..15")
    as_q4_1 = tile_q4_1(q, scale, -8 * scale)  # (checks the shape)
    blocks = as_q4_1.data.view(as_q4_1.data.shape[0], k // GROUP, -1)
    data = torch.cat([blocks[..., :32], blocks[..., 64:]], dim=-1)
    return TiledWeight("q4_0", data.contiguous(), n, k)


# GGUF's IQ4_NL / IQ4_XS values (ggml's kvalues_iq4nl): a weight is its scale times the value
# its 4-bit index picks (gemv.h's IQ4_VALUES)
IQ4_VALUES = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32)


def tile_iq4_nl(q: torch.Tensor, scale: torch.Tensor) -> TiledWeight:
    """GGUF's IQ4_NL as stored: q [N, K] indices in 0..15, scale [N, K / 32] fp16 values d;
    w = d * IQ4_VALUES[q]. q4_0's layout (4.5 bits a weight)."""
    as_q4_0 = tile_q4_0(q, scale)  # (checks the shapes and the range)
    return TiledWeight("iq4_nl", as_q4_0.data, as_q4_0.n, as_q4_0.k)


def _fifth_bits(q: torch.Tensor, n: int) -> torch.Tensor:
    """The fifth bits of 5-bit values q [N, K] (0..31) as the 5-bit formats hold them, per tile
    and group of 32: uint8 [tiles, K / 32, 64], byte 4 r + i holding at bit 2 c that of row r's
    column 8 c + i and at bit 2 c + 1 that of column 8 c + 4 + i (chunk c's two nibbles)."""
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 31):
        raise ValueError("5-bit weights must be in 0..31")
    top = _pad_rows(q.to(torch.uint8), n) >> 4
    tiles, g = top.shape[0] // TILE, q.shape[1] // GROUP
    top = top.view(tiles, TILE, g, 4, 2, 4).permute(0, 2, 1, 5, 3, 4)  # [.., row, i, c, half]
    fifth = torch.zeros(tiles, g, TILE, 4, dtype=torch.uint8)
    for c in range(4):
        for half in range(2):
            fifth |= top[..., c, half] << (2 * c + half)
    return fifth.reshape(tiles, g, 64)


def tile_q5_0(q: torch.Tensor, scale: torch.Tensor) -> TiledWeight:
    """GGUF's Q5_0 as stored: q [N, K] in 0..31, scale [N, K / 32] fp16 values d; w = d (q - 16).
    Per tile and group: q4_0's block of q & 15, then the fifth bits (5.5 bits a weight)."""
    low4 = tile_q4_0(q & 15, scale)  # (checks the shapes)
    fifth = _fifth_bits(q, q.shape[0])
    data = torch.cat([low4.data.view(*fifth.shape[:2], -1), fifth], dim=-1)
    return TiledWeight("q5_0", data.contiguous(), *q.shape)


def tile_q5_1(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> TiledWeight:
    """GGUF's Q5_1 as stored: q [N, K] in 0..31, scale and low [N, K / 32]: w = low + q *
    scale, both fp16. Per tile and group: q4_1's block of q & 15, then the fifth bits."""
    low4 = tile_q4_1(q & 15, scale, low)  # (checks the shapes)
    fifth = _fifth_bits(q, q.shape[0])
    data = torch.cat([low4.data.view(*fifth.shape[:2], -1), fifth], dim=-1)
    return TiledWeight("q5_1", data.contiguous(), *q.shape)


def tile_q8_0(w: Q8_0Weight) -> TiledWeight:
    n, k = w.shape
    _check_weight_shape(n, k, GROUP)
    g = k // GROUP
    q = _pad_rows(w.q, n)
    tiles = q.shape[0] // TILE
    # [tile, row, group, quad, i] -> [tile, group, quad, row, i]
    q = q.view(tiles, TILE, g, 8, 4).permute(0, 2, 3, 1, 4).contiguous().view(torch.uint8)
    scale = _pad_rows(w.scale.float(), n).view(tiles, TILE, g).transpose(1, 2).contiguous()
    data = torch.cat([scale.view(torch.uint8), q.reshape(tiles, g, GROUP * TILE)], dim=-1)
    return TiledWeight("q8_0", data.contiguous(), n, k)


SIX_BIT_GROUP = 16
FP16_MAX = 65504.0


class ScaleOverflow(ValueError):
    """Scales over what the format holds them in (fp16)."""


def tile_q6(q: torch.Tensor, scale: torch.Tensor) -> TiledWeight:
    """q [N, K] int8 in -32..31, scale [N, K / 16]: w = scale * q, the scales held as fp16
    (a GGUF's Q6_K, Q3_K and Q5_0 as stored; `unpack` shows what was kept). Per 16-row tile
    and group of 32: fp16 d[2][16] (the group's halves), then q + 32's low nibbles as q4_1
    holds its nibbles (4 chunks of 64 bytes), then its two high bits: 2 chunks of 64 bytes,
    byte 4r + i of chunk h holding q[r][16h + 4j + i]'s in bits 2j, 2j + 1."""
    n, k = q.shape
    _check_weight_shape(n, k, GROUP)
    if scale.shape != (n, k // SIX_BIT_GROUP):
        raise ValueError(f"expected scales of shape [{n}, {k // SIX_BIT_GROUP}], "
                         f"got {tuple(scale.shape)}")
    if not bool((scale.abs() <= FP16_MAX).all()):
        raise ScaleOverflow(f"6-bit scales must fit fp16 (|scale| <= {FP16_MAX:g})")
    g = k // GROUP
    bits, tiles = _q6_bits(q, n)
    d = _pad_rows(scale.to(torch.float16), n).view(tiles, TILE, g, 2).permute(0, 2, 3, 1)
    data = torch.cat([d.contiguous().view(torch.uint8).reshape(tiles, g, 64), bits], dim=-1)
    return TiledWeight("q6", data.contiguous(), n, k)


def _q6_values(d: torch.Tensor, nib: torch.Tensor, twos: torch.Tensor) -> torch.Tensor:
    """A q6 block's weights [..., 32] in k order from its rows' fields: d [..., 2] fp16 bytes
    or float32 scales, nib [..., 4 chunks, 4] and twos [..., 2 halves, 4] bytes."""
    low = torch.stack([nib & 15, nib >> 4], dim=-2)  # [..., chunk, half, i]
    high = torch.stack([(twos >> (2 * j)) & 3 for j in range(4)], dim=-2)  # [..., h, j, i]
    q = (low.flatten(-3).to(torch.int16) | (high.flatten(-3).to(torch.int16) << 4)) - 32
    d = d if d.dtype == torch.float32 else d.view(torch.float16).float()
    return q.float() * d.repeat_interleave(SIX_BIT_GROUP, dim=-1)


Q6_K_BLOCK_BYTES = 3360  # one tile x super-block: 6.5625 bits a weight, as Q6_K


def _q6_bits(q: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """q [N, K] int8 in -32..31 as q6 holds each group's values: [tiles, groups, 384] bytes
    (q + 32's low nibbles as q4_1 holds its nibbles, then the high bit pairs), and tiles."""
    if int(q.min()) < -32 or int(q.max()) > 31:
        raise ValueError("6-bit weights must be in -32..31")
    g = q.shape[1] // GROUP
    u = _pad_rows((q.to(torch.int16) + 32).to(torch.uint8), n)
    tiles = u.shape[0] // TILE
    low, high = u & 15, u >> 4
    # [tile, row, group, chunk, half, i] -> [tile, group, chunk, row, i, half], as tile_q4_1
    low = low.view(tiles, TILE, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    nibbles = low[..., 0] | (low[..., 1] << 4)
    # [tile, row, group, h, j, i] -> [tile, group, h, row, i, j]
    high = high.view(tiles, TILE, g, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)
    twos = high[..., 0] | (high[..., 1] << 2) | (high[..., 2] << 4) | (high[..., 3] << 6)
    return torch.cat([nibbles.reshape(tiles, g, 256), twos.reshape(tiles, g, 128)], -1), tiles


def tile_q6_k(q: torch.Tensor, scales: torch.Tensor, d: torch.Tensor) -> TiledWeight:
    """GGUF's Q6_K as stored: q [N, K] int8 in -32..31, scales [N, K / 16] int8, d [N, K / 256]
    fp16 values; w = (d * sc) * q in float32, as ggml computes it. Per 16-row tile and
    super-block of 256 (Q6_K_BLOCK_BYTES): fp16 d[16], the int8 scales (256 bytes: byte 16 s + r
    holds row r's s-th), then each of its 8 groups of 32 as q6 holds a group's values (q6's
    nibbles and high bit pairs, 384 bytes)."""
    n, k = q.shape
    _check_weight_shape(n, k, SUPER_BLOCK)
    s = k // SUPER_BLOCK
    for name, t, cols in (("scales", scales, k // SIX_BIT_GROUP), ("d", d, s)):
        if t.shape != (n, cols):
            raise ValueError(f"expected {name} of shape [{n}, {cols}], got {tuple(t.shape)}")
    if int(scales.min()) < -128 or int(scales.max()) > 127:
        raise ValueError("Q6_K's scales must be int8")
    bits, tiles = _q6_bits(q, n)
    data = torch.cat([_k6_header(scales, d, n, tiles), bits.reshape(tiles, s, 8 * 384)], dim=-1)
    return TiledWeight("q6_k", data.contiguous(), n, k)


def _k6_header(scales: torch.Tensor, d: torch.Tensor, n: int, tiles: int) -> torch.Tensor:
    """q6_k's and q3_k's header per tile and super-block: fp16 d[16], then the int8 scales
    (byte 16 s + r: row r's s-th): uint8 [tiles, super-blocks, 288]."""
    s = d.shape[1]
    dh = _pad_rows(d.to(torch.float16), n).view(tiles, TILE, s).permute(0, 2, 1)
    sc = _pad_rows(scales.to(torch.int8), n).view(tiles, TILE, s, 16).permute(0, 2, 3, 1)
    return torch.cat([dh.contiguous().view(torch.uint8).reshape(tiles, s, 32),
                      sc.contiguous().view(torch.uint8).reshape(tiles, s, 256)], dim=-1)


Q3_K_BLOCK_BYTES = 1824  # one tile x super-block: 3.5625 bits a weight (GGUF's Q3_K: 3.4375)


def tile_q3_k(q: torch.Tensor, scales: torch.Tensor, d: torch.Tensor) -> TiledWeight:
    """GGUF's Q3_K as stored: q [N, K] int8 in -4..3, scales [N, K / 16] int8 in -32..31, d
    [N, K / 256] fp16 values; w = (d * sc) * q in float32, as ggml computes it. Per 16-row tile
    and super-block of 256 (Q3_K_BLOCK_BYTES): q6_k's header, then each group's q + 4 as its
    low bit pairs (128 bytes, laid out as q6's high bit pairs) and its third bits (64 bytes:
    bit p of byte 4 r + i holds that of row r's column 4 p + i)."""
    n, k = q.shape
    _check_weight_shape(n, k, SUPER_BLOCK)
    s, g = k // SUPER_BLOCK, k // GROUP
    for name, t, cols in (("scales", scales, k // SIX_BIT_GROUP), ("d", d, s)):
        if t.shape != (n, cols):
            raise ValueError(f"expected {name} of shape [{n}, {cols}], got {tuple(t.shape)}")
    if q.numel() and (int(q.min()) < -4 or int(q.max()) > 3):
        raise ValueError("3-bit weights must be in -4..3")
    if scales.numel() and (int(scales.min()) < -32 or int(scales.max()) > 31):
        raise ValueError("Q3_K's scales must be in -32..31")
    u = _pad_rows((q.to(torch.int16) + 4).to(torch.uint8), n)
    tiles = u.shape[0] // TILE
    # low bit pairs: [tile, row, group, h, j, i] -> [tile, group, h, row, i, j] (as _q6_bits)
    low = (u & 3).view(tiles, TILE, g, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)
    pairs = low[..., 0] | (low[..., 1] << 2) | (low[..., 2] << 4) | (low[..., 3] << 6)
    # third bits: [tile, row, group, p, i] -> [tile, group, row, i, p]
    third = (u >> 2).view(tiles, TILE, g, 8, 4).permute(0, 2, 1, 4, 3)
    thirds = torch.zeros(third.shape[:-1], dtype=torch.uint8)
    for p in range(8):
        thirds |= third[..., p] << p
    bits = torch.cat([pairs.reshape(tiles, g, 128), thirds.reshape(tiles, g, 64)], -1)
    data = torch.cat([_k6_header(scales, d, n, tiles), bits.reshape(tiles, s, 8 * 192)], dim=-1)
    return TiledWeight("q3_k", data.contiguous(), n, k)


Q2_K_BLOCK_BYTES = 1344  # one tile x super-block: 2.625 bits a weight, as GGUF's Q2_K


def tile_q2_k(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, d: torch.Tensor,
              dmin: torch.Tensor) -> TiledWeight:
    """GGUF's Q2_K as stored: q [N, K] in 0..3, scales and mins [N, K / 16] in 0..15, d and
    dmin [N, K / 256] fp16 values; w = (d * sc) * q - dmin * m in float32, as ggml computes it.
    Per 16-row tile and super-block of 256 (Q2_K_BLOCK_BYTES): fp16 d[16], dmin[16], the half
    groups' scale bytes sc | m << 4 (256 bytes: byte 16 s + r, row r's s-th), then each group's
    values as q3_k's low bit pairs (128 bytes)."""
    n, k = q.shape
    _check_weight_shape(n, k, SUPER_BLOCK)
    s, g = k // SUPER_BLOCK, k // GROUP
    per16 = k // SIX_BIT_GROUP
    for name, t, cols in (("scales", scales, per16), ("mins", mins, per16), ("d", d, s),
                          ("dmin", dmin, s)):
        if t.shape != (n, cols):
            raise ValueError(f"expected {name} of shape [{n}, {cols}], got {tuple(t.shape)}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 3):
        raise ValueError("2-bit weights must be in 0..3")
    if min(int(scales.min()), int(mins.min())) < 0 or max(int(scales.max()), int(mins.max())) > 15:
        raise ValueError("Q2_K's scales and mins must be 4-bit (0..15)")
    u = _pad_rows(q.to(torch.uint8), n)
    tiles = u.shape[0] // TILE
    low = u.view(tiles, TILE, g, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)  # as tile_q3_k's pairs
    pairs = low[..., 0] | (low[..., 1] << 2) | (low[..., 2] << 4) | (low[..., 3] << 6)

    def halves(t: torch.Tensor) -> torch.Tensor:  # fp16 [tile, super, row] -> 32 bytes
        t = _pad_rows(t.to(torch.float16), n).view(tiles, TILE, s).permute(0, 2, 1)
        return t.contiguous().view(torch.uint8).reshape(tiles, s, 32)

    sb = (scales.to(torch.uint8) | (mins.to(torch.uint8) << 4))
    sb = _pad_rows(sb, n).view(tiles, TILE, s, 16).permute(0, 2, 3, 1).reshape(tiles, s, 256)
    data = torch.cat([halves(d), halves(dmin), sb, pairs.reshape(tiles, s, 8 * 128)], dim=-1)
    return TiledWeight("q2_k", data.contiguous(), n, k)


def _q2_values(d: torch.Tensor, dmin: torch.Tensor, sb: torch.Tensor,
               pairs: torch.Tensor) -> torch.Tensor:
    """A q2_k group's weights [..., 32] in k order from a row's fields: d, dmin [..., 1]
    float32, its half groups' scale bytes sb [..., 2] and pairs [..., 2 halves, 4] bytes."""
    j = torch.arange(4)
    q = ((pairs[..., :, None, :] >> (2 * j)[:, None]) & 3).flatten(-3).float()  # 16 h + 4 j + i
    scale = (d * (sb & 15).float()).repeat_interleave(SIX_BIT_GROUP, dim=-1)
    low = (dmin * (sb >> 4).float()).repeat_interleave(SIX_BIT_GROUP, dim=-1)
    return scale * q - low


def _q3_values(scale: torch.Tensor, pairs: torch.Tensor, thirds: torch.Tensor) -> torch.Tensor:
    """A q3_k group's weights [..., 32] in k order from a row's fields: scale [..., 2] float32
    (d * sc per half group), pairs [..., 2 halves, 4] and thirds [..., 4] bytes."""
    j = torch.arange(4)
    low = (pairs[..., :, None, :] >> (2 * j)[:, None]) & 3  # [..., h, j, i]
    at = (4 * torch.arange(2)[:, None] + j)[..., None]  # quad p = 4 h + j
    high = (thirds[..., None, None, :] >> at) & 1
    q = (low | (high << 2)).flatten(-3).to(torch.int16) - 4  # column 16 h + 4 j + i
    return q.float() * scale.repeat_interleave(SIX_BIT_GROUP, dim=-1)


SUPER_BLOCK = 256  # q4_k's weights per fp16 d/dmin pair along k (GGUF's Q4_K super-block)
Q4_K_BLOCK_BYTES = 2304  # one tile x super-block: 4.5 bits a weight, as Q4_K


def tile_q4_k(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, d: torch.Tensor,
              dmin: torch.Tensor) -> TiledWeight:
    """GGUF's Q4_K as stored: q [N, K] in 0..15, scales and mins [N, K / 32] six-bit (0..63),
    d and dmin [N, K / 256] fp16 values; w = (d * sc) * q - (dmin * mn) in float32, as ggml
    computes it. Per 16-row tile and super-block of 256 (Q4_K_BLOCK_BYTES): fp16 d[16], fp16
    dmin[16]; the sub-blocks' scales' low nibbles (64 bytes: byte 16 p + r holds row r's
    sub-blocks 2p and 2p + 1, low nibble first), the mins' likewise; the scales' two high
    bits (32 bytes: byte 16 h + r holds row r's sub-blocks 4h + i at bits 2i), the mins'
    likewise; then the 8 sub-blocks' nibbles, each as q4_1 holds a group's (256 bytes)."""
    n, k = q.shape
    _check_weight_shape(n, k, SUPER_BLOCK)
    g, s = k // GROUP, k // SUPER_BLOCK
    for name, t, cols in (("scales", scales, g), ("mins", mins, g), ("d", d, s), ("dmin", dmin, s)):
        if t.shape != (n, cols):
            raise ValueError(f"expected {name} of shape [{n}, {cols}], got {tuple(t.shape)}")
    if int(q.min()) < 0 or int(q.max()) > 15:
        raise ValueError("4-bit weights must be in 0..15")
    if min(int(scales.min()), int(mins.min())) < 0 or max(int(scales.max()), int(mins.max())) > 63:
        raise ValueError("Q4_K's scales and mins must be six-bit (0..63)")
    u = _pad_rows(q.to(torch.uint8), n)
    tiles = u.shape[0] // TILE
    # [tile, row, super-block, sub-block, chunk, half, i] -> [tile, super, sub, chunk, row, i, half]
    u = u.view(tiles, TILE, s, 8, 4, 2, 4).permute(0, 2, 3, 4, 1, 6, 5)
    nibbles = (u[..., 0] | (u[..., 1] << 4)).reshape(tiles, s, 2048)

    def per_super(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:  # [tile, super, .., row]
        t = _pad_rows(t.to(dtype), n)
        return t.view(tiles, TILE, s, -1).permute(0, 2, 3, 1)

    def halves(t: torch.Tensor) -> torch.Tensor:  # fp16 [tile, super, 1, row] -> 32 bytes
        return per_super(t, torch.float16).contiguous().view(torch.uint8).reshape(tiles, s, 32)

    def six_bit(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v = per_super(t, torch.uint8)  # [tile, super, sub-block, row]
        low = (v[:, :, 0::2] & 15) | ((v[:, :, 1::2] & 15) << 4)
        top = (v >> 4).view(tiles, s, 2, 4, TILE)
        high = top[:, :, :, 0] | (top[:, :, :, 1] << 2) | (top[:, :, :, 2] << 4) \
            | (top[:, :, :, 3] << 6)
        return low.reshape(tiles, s, 64), high.reshape(tiles, s, 32)

    sc_low, sc_high = six_bit(scales)
    mn_low, mn_high = six_bit(mins)
    data = torch.cat([halves(d), halves(dmin), sc_low, mn_low, sc_high, mn_high, nibbles], -1)
    return TiledWeight("q4_k", data.contiguous(), n, k)


Q5_K_BLOCK_BYTES = 2816  # one tile x super-block: 5.5 bits a weight, as Q5_K


def tile_q5_k(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, d: torch.Tensor,
              dmin: torch.Tensor) -> TiledWeight:
    """GGUF's Q5_K as stored: tile_q4_k's fields with q [N, K] in 0..31. Per 16-row tile and
    super-block of 256 (Q5_K_BLOCK_BYTES): q4_k's header, then each sub-block's nibbles (q &
    15, as q4_k holds them: 256 bytes) followed by its fifth bits (64 bytes: byte 4 r + i holds
    at bit 2 c that of row r's column 8 c + i, at bit 2 c + 1 that of column 8 c + 4 + i)."""
    low = tile_q4_k(q & 15, scales, mins, d, dmin)  # (checks the fields' shapes)
    n, k = q.shape
    s = k // SUPER_BLOCK
    tiles = low.data.shape[0]
    b = low.data.view(tiles, s, Q4_K_BLOCK_BYTES)
    fifth = _fifth_bits(q, n).view(tiles, s, 8, 64)
    groups = torch.cat([b[..., 256:].reshape(tiles, s, 8, 256), fifth], -1)
    data = torch.cat([b[..., :256], groups.reshape(tiles, s, 8 * 320)], -1)
    return TiledWeight("q5_k", data.contiguous(), n, k)


IQ4_XS_BLOCK_BYTES = 2208  # one tile x super-block: 4.31 bits a weight (GGUF's IQ4_XS: 4.25)


def tile_iq4_xs(q: torch.Tensor, scales: torch.Tensor, d: torch.Tensor) -> TiledWeight:
    """GGUF's IQ4_XS as stored: q [N, K] indices in 0..15, scales [N, K / 32] in -32..31 (its
    six-bit ls - 32), d [N, K / 256] fp16 values; w = (d * sc) * IQ4_VALUES[q], as ggml
    computes it (exact in float32). Per 16-row tile and super-block of 256
    (IQ4_XS_BLOCK_BYTES): fp16 d[16], the int8 scales (128 bytes: byte 16 j + r holds row r's
    group j), then the 8 groups' nibbles as q4_k holds them."""
    n, k = q.shape
    if scales.shape != (n, k // GROUP):
        raise ValueError(f"expected scales of shape [{n}, {k // GROUP}], got {tuple(scales.shape)}")
    if scales.numel() and (int(scales.min()) < -32 or int(scales.max()) > 31):
        raise ValueError("IQ4_XS's scales must be in -32..31")
    zeros = torch.zeros(n, k // GROUP, dtype=torch.uint8)
    as_q4_k = tile_q4_k(q, zeros, zeros, d, torch.zeros_like(d))  # (checks q and d)
    tiles, s = as_q4_k.data.shape[0], k // SUPER_BLOCK
    b = as_q4_k.data.view(tiles, s, Q4_K_BLOCK_BYTES)
    sc = _pad_rows(scales.to(torch.int8), n).view(tiles, TILE, s, 8).permute(0, 2, 3, 1)
    data = torch.cat([b[..., :32], sc.contiguous().view(torch.uint8).reshape(tiles, s, 128),
                      b[..., 256:]], -1)
    return TiledWeight("iq4_xs", data.contiguous(), n, k)


def _q4_k_values(d: torch.Tensor, dmin: torch.Tensor, sc_low: torch.Tensor, mn_low: torch.Tensor,
                 sc_high: torch.Tensor, mn_high: torch.Tensor, nib: torch.Tensor,
                 fifth: torch.Tensor | None = None) -> torch.Tensor:
    """A row's q4_k (q5_k) weights [..., S * 256] from its fields per super-block: d, dmin
    float32 [..., S]; sc_low, mn_low [..., S, 4], sc_high, mn_high [..., S, 2], nib [..., S, 8
    sub-blocks, 4 chunks, 4] bytes and q5_k's fifth bits [..., S, 8 sub-blocks, 4] bytes."""
    def six_bit(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:  # -> [..., S, 8]
        lo = torch.stack([low & 15, low >> 4], dim=-1).flatten(-2)
        hi = torch.stack([(high >> (2 * i)) & 3 for i in range(4)], dim=-1).flatten(-2)
        return (lo | (hi << 4)).float()

    scale = d[..., None] * six_bit(sc_low, sc_high)
    low = dmin[..., None] * six_bit(mn_low, mn_high)
    q = torch.stack([nib & 15, nib >> 4], dim=-2)  # [..., S, 8, chunk, half, i]
    if fifth is not None:
        at = 2 * torch.arange(4)[:, None, None] + torch.arange(2)[:, None]  # [chunk, half, 1]
        q = q | (((fifth[..., None, None, :] >> at) & 1) << 4)
    q = q.flatten(-3).float()  # [..., S, 8, 32]
    return (q * scale[..., None] - low[..., None]).flatten(-3)


# GGUF block types rf_repack converts (ggml's type ids) and the format each becomes
# (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_0, IQ4_NL, IQ4_XS)
REPACKS = {(2, "q4_0"), (2, "q4_1"), (3, "q4_1"), (6, "q5_0"), (7, "q5_1"), (10, "q2_k"),
           (11, "q3_k"), (12, "q4_1"), (12, "q4_k"), (13, "q5_k"), (14, "q6"), (14, "q6_k"),
           (8, "q8_0"), (20, "iq4_nl"), (23, "iq4_xs")}
_GROUP_BYTES = {"q4_0": 288, "q4_1": 320, "q5_0": 352, "q5_1": 384, "q6": 448, "q8_0": 576,
                "iq4_nl": 288}
# bytes before the nibbles
_GROUP_HEADER = {"q4_0": 32, "q5_0": 32, "iq4_nl": 32, "q4_1": 64, "q5_1": 64}
# the low of a group without stored minimums, in units of its d (iq4_nl: none)
_LOW_PER_D = {"q4_0": -8, "q5_0": -16, "iq4_nl": 0}
# the bit of a fifth-bits byte that chunk c's half h takes, [c, h]
_FIFTH_AT = 2 * torch.arange(4)[:, None] + torch.arange(2)
_SUPER_BLOCK_BYTES = {"q4_k": Q4_K_BLOCK_BYTES, "q5_k": Q5_K_BLOCK_BYTES, "q6_k": Q6_K_BLOCK_BYTES,
                      "iq4_xs": IQ4_XS_BLOCK_BYTES, "q3_k": Q3_K_BLOCK_BYTES,
                      "q2_k": Q2_K_BLOCK_BYTES}


def repack(raw: torch.Tensor, ggml_type: int, fmt: str, k: int) -> TiledWeight | None:
    """A GGUF tensor's rows of blocks (uint8 [rows, row bytes], type `ggml_type`) tiled in `fmt`
    by the C kernels (repack.c): the bytes tile_* writes from gguf_blocks' group forms, without
    them. None where no build is loaded or the pair is not one of REPACKS; raises ScaleOverflow
    as tile_q6 does."""
    lib = _library()
    if lib is None or (ggml_type, fmt) not in REPACKS:
        return None
    from ..gguf_blocks import row_bytes

    rows = raw.shape[0]
    _check_weight_shape(rows, k, GROUP)
    if raw.dtype != torch.uint8 or raw.dim() != 2 or raw.shape[1] != row_bytes(ggml_type, k):
        raise ValueError(f"expected uint8 rows of {row_bytes(ggml_type, k)} bytes, got "
                         f"{raw.dtype} {tuple(raw.shape)}")
    raw = raw.contiguous()
    per_tile = ((k // SUPER_BLOCK, _SUPER_BLOCK_BYTES[fmt]) if fmt in _SUPER_BLOCK_BYTES
                else (k // GROUP, _GROUP_BYTES[fmt]))
    out = torch.empty((-(-rows // TILE), *per_tile), dtype=torch.uint8)
    got = lib.rf_repack(ggml_type, abi.FORMATS[fmt], raw.data_ptr(), rows, k, out.data_ptr(),
                        torch.get_num_threads())
    if got == -1:
        raise ValueError(f"rf_repack: {k} columns are not whole blocks of GGML type {ggml_type}")
    if got == -2:
        raise MemoryError("rf_repack: no memory for its scratch rows")
    if got:
        raise ScaleOverflow(f"6-bit scales must fit fp16 (|scale| <= {FP16_MAX:g}): "
                            f"{got} do not")
    return TiledWeight(fmt, out, rows, k)


def tile_bf16(weight: torch.Tensor) -> TiledWeight:
    n, k = weight.shape
    _check_weight_shape(n, k, 2)
    w = _pad_rows(weight.detach().to(torch.bfloat16), n)
    tiles = w.shape[0] // TILE
    w = w.view(tiles, TILE, k // 2, 2).transpose(1, 2).contiguous()
    return TiledWeight("bf16", w.view(torch.uint8).view(tiles, -1), n, k)


def unpack(w: TiledWeight) -> torch.Tensor:
    """The float32 weights [n, k] a tiled weight holds (the torch reference's weights)."""
    n, k, tiles = w.n, w.k, w.data.shape[0]
    if w.format == "bf16":
        dense = w.data.view(torch.bfloat16).view(tiles, k // 2, TILE, 2).transpose(1, 2)
        return dense.reshape(tiles * TILE, k)[:n].float()
    if w.format in ("q4_k", "q5_k"):  # -> [tile, row, super-block, ...] fields of each row
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, _SUPER_BLOCK_BYTES[w.format])

        def rows_of(lo: int, hi: int, *shape: int) -> torch.Tensor:
            return b[..., lo:hi].reshape(tiles, s, *shape, TILE).movedim(-1, 1)

        def halves(lo: int) -> torch.Tensor:
            return b[..., lo:lo + 32].contiguous().view(torch.float16).float().transpose(1, 2)

        groups = b[..., 256:].reshape(tiles, s, 8, -1)  # 256 bytes of nibbles (q5_k: + 64)
        nib = groups[..., :256].reshape(tiles, s, 8, 4, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        fifth = None
        if w.format == "q5_k":
            fifth = groups[..., 256:].reshape(tiles, s, 8, TILE, 4).permute(0, 3, 1, 2, 4)
        dense = _q4_k_values(halves(0), halves(32), rows_of(64, 128, 4), rows_of(128, 192, 4),
                             rows_of(192, 224, 2), rows_of(224, 256, 2), nib, fifth)
        return dense.reshape(tiles * TILE, k)[:n]
    if w.format == "iq4_xs":  # -> [tile, row, super-block, group, ...]
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, IQ4_XS_BLOCK_BYTES)
        scale = _tiles_d_times_int8(b, 8)  # [tile, row, s, 8]
        nib = b[..., 160:].reshape(tiles, s, 8, 4, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        q = torch.stack([nib & 15, nib >> 4], dim=-2).flatten(-3)  # [t, row, s, 8, 32]
        dense = scale[..., None] * IQ4_VALUES[q.long()]
        return dense.reshape(tiles * TILE, k)[:n]
    if w.format == "q6_k":  # -> [tile, row, super-block, group, ...] fields of each row
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q6_K_BLOCK_BYTES)
        scale = _tiles_d_times_int8(b, 16)  # [tile, row, s, 16]
        bits = b[..., 288:].reshape(tiles, s, 8, 384)
        nib = bits[..., :256].reshape(tiles, s, 8, 4, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        twos = bits[..., 256:].reshape(tiles, s, 8, 2, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        dense = _q6_values(scale.reshape(tiles, TILE, s, 8, 2), nib, twos)
        return dense.reshape(tiles * TILE, k)[:n]
    if w.format == "q2_k":  # -> [tile, row, super-block, group, ...] fields of each row
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q2_K_BLOCK_BYTES)

        def halves(lo: int) -> torch.Tensor:  # [tile, row, s, 1, 1]
            h = b[..., lo:lo + 32].contiguous().view(torch.float16).float().transpose(1, 2)
            return h[..., None, None]

        sb = b[..., 64:320].reshape(tiles, s, 8, 2, TILE).permute(0, 4, 1, 2, 3)
        pairs = b[..., 320:].reshape(tiles, s, 8, 2, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        dense = _q2_values(halves(0), halves(32), sb, pairs)
        return dense.reshape(tiles * TILE, k)[:n]
    if w.format == "q3_k":  # -> [tile, row, super-block, group, ...] fields of each row
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q3_K_BLOCK_BYTES)
        scale = _tiles_d_times_int8(b, 16)  # [tile, row, s, 16]
        bits = b[..., 288:].reshape(tiles, s, 8, 192)
        pairs = bits[..., :128].reshape(tiles, s, 8, 2, TILE, 4).permute(0, 4, 1, 2, 3, 5)
        thirds = bits[..., 128:].reshape(tiles, s, 8, TILE, 4).permute(0, 3, 1, 2, 4)
        dense = _q3_values(scale.reshape(tiles, TILE, s, 8, 2), pairs, thirds)
        return dense.reshape(tiles * TILE, k)[:n]
    g = k // GROUP
    blocks = w.data.view(tiles, g, -1)
    if w.format == "q6":  # -> [tile, row, group, ...] fields of each row
        d = blocks[..., :64].reshape(tiles, g, 2, TILE, 2).permute(0, 3, 1, 2, 4)
        nib = blocks[..., 64:320].reshape(tiles, g, 4, TILE, 4).permute(0, 3, 1, 2, 4)
        twos = blocks[..., 320:].reshape(tiles, g, 2, TILE, 4).permute(0, 3, 1, 2, 4)
        dense = _q6_values(d.reshape(tiles, TILE, g, 4).contiguous(), nib, twos)
        return dense.reshape(tiles * TILE, k)[:n]
    if w.format == "q8_0":
        scale = blocks[..., :64].contiguous().view(torch.float32)  # [tiles, g, 16]
        q = blocks[..., 64:].contiguous().view(torch.int8).view(tiles, g, 8, TILE, 4).float()
        dense = q.permute(0, 3, 1, 2, 4).reshape(tiles, TILE, g, GROUP) \
            * scale.transpose(1, 2)[..., None]
        return dense.reshape(tiles * TILE, k)[:n]
    d = blocks[..., :32].contiguous().view(torch.float16).float()
    at = _GROUP_HEADER[w.format]
    if at == 32:  # q4_0, q5_0, iq4_nl: low -8 d, -16 d, none (exact)
        low = d * _LOW_PER_D[w.format]
    else:
        low = blocks[..., 32:64].contiguous().view(torch.float16).float()
    nib = blocks[..., at:at + 256].contiguous().view(tiles, g, 4, TILE, 4)
    q = torch.stack([nib & 15, nib >> 4], dim=-1)  # [tile, group, chunk, row, i, half]
    if w.format in ("q5_0", "q5_1"):
        fifth = blocks[..., at + 256:].contiguous().view(tiles, g, 1, TILE, 4, 1)
        q = q | (((fifth >> _FIFTH_AT.view(4, 1, 1, 2)) & 1) << 4)
    q = q.permute(0, 3, 1, 2, 5, 4).reshape(tiles, TILE, g, GROUP)
    if w.format == "iq4_nl":  # (no low: d v alone, as ggml's bits, zeros' signs included)
        dense = IQ4_VALUES[q.long()] * d.transpose(1, 2)[..., None]
    else:
        dense = low.transpose(1, 2)[..., None] + q.float() * d.transpose(1, 2)[..., None]
    return dense.reshape(tiles * TILE, k)[:n]


def _rows_d_times_int8(b: torch.Tensor, tile: torch.Tensor, row: torch.Tensor,
                       count: int) -> torch.Tensor:
    """Rows `row` of tiles `tile`: d * each int8 scale of a super-block header (fp16 d[16],
    then byte 32 + 16 j + r: row r's j-th scale; q6_k, q3_k, iq4_xs), float32 [n, s, count];
    b: the tiles' bytes [tiles, s, block]."""
    r, supers = row[:, None, None], torch.arange(b.shape[1])[None, :, None]
    d = b[tile[:, None, None], supers, 2 * r + torch.arange(2)].contiguous()
    sc = b[tile[:, None, None], supers, 32 + 16 * torch.arange(count) + r].contiguous()
    return d.view(torch.float16).float() * sc.view(torch.int8).float()


def _tiles_d_times_int8(b: torch.Tensor, count: int) -> torch.Tensor:
    """Every row's d * int8 scales of super-block headers (as _rows_d_times_int8), float32
    [tiles, 16 rows, s, count]; b: [tiles, s, block]."""
    tiles, s = b.shape[:2]
    d = b[..., :32].contiguous().view(torch.float16).float().transpose(1, 2)  # [t, row, s]
    sc = b[..., 32:32 + 16 * count].contiguous().view(torch.int8).view(tiles, s, count, TILE)
    return d[..., None] * sc.permute(0, 3, 1, 2).float()


def gather_rows(w: TiledWeight, ids: torch.Tensor) -> torch.Tensor:
    """float32 [len(ids), k]: rows `ids` of w's weights (an embedding lookup in the tiles),
    equal to `unpack(w)[ids]`; reads only those rows' bytes."""
    ids = ids.reshape(-1).long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= w.n):
        raise IndexError(f"row ids must be in [0, {w.n})")
    tile, row = ids // TILE, ids % TILE
    k, g, tiles = w.k, w.k // GROUP, w.data.shape[0]
    if w.format == "bf16":
        dense = w.data.view(torch.bfloat16).view(tiles, k // 2, TILE, 2)
        return dense[tile, :, row, :].reshape(-1, k).float()
    if w.format in ("q4_k", "q5_k"):  # fields of each id's row, per super-block
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, _SUPER_BLOCK_BYTES[w.format])
        r = row[:, None, None]

        def field(offsets: torch.Tensor) -> torch.Tensor:  # [n, 1, count] -> bytes [n, s, count]
            return b[tile[:, None, None], torch.arange(s)[None, :, None], offsets]

        def halves(lo: int) -> torch.Tensor:
            pair = field(lo + 2 * r + torch.arange(2)).contiguous()
            return pair.view(torch.float16)[..., 0].float()

        def per_row(lo: int, count: int) -> torch.Tensor:
            return field(lo + 16 * torch.arange(count) + r)

        group = 256 + (256 if w.format == "q4_k" else 320) * torch.arange(8)
        sub_chunk_i = (group[:, None, None] + 64 * torch.arange(4)[:, None]
                       + torch.arange(4)).reshape(-1)
        nib = field(sub_chunk_i + 4 * r).view(-1, s, 8, 4, 4)
        fifth = None
        if w.format == "q5_k":
            fifth = field((group[:, None] + 256 + torch.arange(4)).reshape(-1) + 4 * r)
            fifth = fifth.view(-1, s, 8, 4)
        return _q4_k_values(halves(0), halves(32), per_row(64, 4), per_row(128, 4),
                            per_row(192, 2), per_row(224, 2), nib, fifth).reshape(-1, k)
    if w.format == "iq4_xs":  # fields of each id's row, per super-block
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, IQ4_XS_BLOCK_BYTES)
        r, supers = row[:, None, None], torch.arange(s)[None, :, None]
        scale = _rows_d_times_int8(b, tile, row, 8)  # [n, s, 8]
        group = 160 + 256 * torch.arange(8)[:, None, None]
        nib_bytes = (group + 64 * torch.arange(4)[:, None] + torch.arange(4)).reshape(-1)
        nib = b[tile[:, None, None], supers, nib_bytes + 4 * r].view(-1, s, 8, 4, 1, 4)
        q = torch.cat([nib & 15, nib >> 4], dim=-2).flatten(-3)  # [n, s, 8, 32]
        return (scale[..., None] * IQ4_VALUES[q.long()]).reshape(-1, k)
    if w.format == "q6_k":  # fields of each id's row, per super-block and group
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q6_K_BLOCK_BYTES)
        r, supers = row[:, None, None], torch.arange(s)[None, :, None]
        scale = _rows_d_times_int8(b, tile, row, 16)  # [n, s, 16]
        group = 288 + 384 * torch.arange(8)[:, None, None]
        nib_bytes = (group + 64 * torch.arange(4)[:, None] + torch.arange(4)).reshape(-1)
        two_bytes = (group + 256 + 64 * torch.arange(2)[:, None] + torch.arange(4)).reshape(-1)
        nib = b[tile[:, None, None], supers, nib_bytes + 4 * r].view(-1, s, 8, 4, 4)
        twos = b[tile[:, None, None], supers, two_bytes + 4 * r].view(-1, s, 8, 2, 4)
        return _q6_values(scale.view(-1, s, 8, 2), nib, twos).reshape(-1, k)
    if w.format == "q2_k":  # fields of each id's row, per super-block and group
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q2_K_BLOCK_BYTES)
        r = row[:, None, None]
        supers = torch.arange(s)[None, :, None]

        def halves(lo: int) -> torch.Tensor:  # [n, s, 1, 1]
            pair = b[tile[:, None, None], supers, lo + 2 * r + torch.arange(2)].contiguous()
            return pair.view(torch.float16).float()[..., None]

        sb = b[tile[:, None, None], supers, 64 + 16 * torch.arange(16) + r].view(-1, s, 8, 2)
        group = 320 + 128 * torch.arange(8)[:, None, None]
        pair_bytes = (group + 64 * torch.arange(2)[:, None] + torch.arange(4)).reshape(-1)
        pairs = b[tile[:, None, None], supers, pair_bytes + 4 * r].view(-1, s, 8, 2, 4)
        return _q2_values(halves(0), halves(32), sb, pairs).reshape(-1, k)
    if w.format == "q3_k":  # fields of each id's row, per super-block and group
        s = k // SUPER_BLOCK
        b = w.data.view(tiles, s, Q3_K_BLOCK_BYTES)
        r, supers = row[:, None, None], torch.arange(s)[None, :, None]
        scale = _rows_d_times_int8(b, tile, row, 16)  # [n, s, 16]
        group = 288 + 192 * torch.arange(8)[:, None, None]
        pair_bytes = (group + 64 * torch.arange(2)[:, None] + torch.arange(4)).reshape(-1)
        third_bytes = (group[:, 0] + 128 + torch.arange(4)).reshape(-1)
        pairs = b[tile[:, None, None], supers, pair_bytes + 4 * r].view(-1, s, 8, 2, 4)
        thirds = b[tile[:, None, None], supers, third_bytes + 4 * r].view(-1, s, 8, 4)
        return _q3_values(scale.view(-1, s, 8, 2), pairs, thirds).reshape(-1, k)
    blocks = w.data.view(tiles, g, -1)
    r = row[:, None, None]
    groups = torch.arange(g)[None, :, None]
    if w.format == "q6":  # [d fp16: half, row][nibbles: chunk, row, 4][twos: half, row, 4]
        d = blocks[tile[:, None, None], groups,
                   (32 * torch.arange(2)[:, None] + torch.arange(2)).reshape(-1) + 2 * r]
        nib_bytes = 64 + (torch.arange(4)[:, None] * 64 + torch.arange(4)).reshape(-1) + 4 * r
        two_bytes = 320 + (torch.arange(2)[:, None] * 64 + torch.arange(4)).reshape(-1) + 4 * r
        nib = blocks[tile[:, None, None], groups, nib_bytes].view(-1, g, 4, 4)
        twos = blocks[tile[:, None, None], groups, two_bytes].view(-1, g, 2, 4)
        return _q6_values(d.contiguous(), nib, twos).reshape(-1, k)
    if w.format == "q8_0":  # [scale f32 x 16 rows][quad 0..7][row][4 int8]
        scale_bytes = 4 * r + torch.arange(4)
        quant = 64 + (torch.arange(8)[:, None] * 64 + torch.arange(4)).reshape(-1) + 4 * r
        scale = blocks[tile[:, None, None], groups, scale_bytes].contiguous().view(torch.float32)
        q = blocks[tile[:, None, None], groups, quant].contiguous().view(torch.int8).float()
        return (q * scale).reshape(-1, k)
    # q4_1: [d fp16 x 16][low fp16 x 16][chunk 0..3][row][4 bytes: half 0 low nibble, 1 high]
    # q4_0: [d fp16 x 16][chunk 0..3][row][4 bytes] (low -8 d); q5_1, q5_0 (low -16 d): the
    # same, then [row][4 bytes of fifth bits]
    d = blocks[tile[:, None, None], groups, 2 * r + torch.arange(2)].contiguous()
    d = d.view(torch.float16).float()
    at = _GROUP_HEADER[w.format]
    if at == 32:
        low = d * _LOW_PER_D[w.format]
    else:
        low = blocks[tile[:, None, None], groups, 32 + 2 * r + torch.arange(2)].contiguous()
        low = low.view(torch.float16).float()
    nib_bytes = at + (torch.arange(4)[:, None] * 64 + torch.arange(4)).reshape(-1) + 4 * r
    nib = blocks[tile[:, None, None], groups, nib_bytes].view(-1, g, 4, 1, 4)  # chunk, i
    q = torch.cat([nib & 15, nib >> 4], dim=3)  # [n, group, chunk, half, i]
    if w.format in ("q5_0", "q5_1"):
        fifth = blocks[tile[:, None, None], groups, at + 256 + 4 * r + torch.arange(4)]
        q = q | (((fifth.view(-1, g, 1, 1, 4) >> _FIFTH_AT.view(4, 2, 1)) & 1) << 4)
    q = q.reshape(-1, g, GROUP)  # chunk, half, i
    if w.format == "iq4_nl":
        return (IQ4_VALUES[q.long()] * d).reshape(-1, k)
    return (low + q.float() * d).reshape(-1, k)


# ---- products ----

def _input(x: torch.Tensor, w: TiledWeight) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != w.k:
        raise ValueError(f"expected x of shape [M, {w.k}], got {tuple(x.shape)}")
    if not x.is_cpu:
        raise ValueError("CPU kernels need CPU tensors")
    # bf16 multiplies bf16 pairs (vdpbf16ps); the integer formats split fp32 x (gemv.c)
    want = torch.bfloat16 if w.format == "bf16" else torch.float32
    return x if x.dtype == want and x.is_contiguous() else x.to(want).contiguous()


def gemm(x: torch.Tensor, w: TiledWeight, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [M, K] @ w.T -> [M, N] in out_dtype (float32 or bfloat16); fp32 sums."""
    x = _input(x, w)
    lib = _library(w.level) if w.level else None
    if lib is None:
        return reference(x, w).to(out_dtype)
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    m = x.shape[0]
    y = torch.empty(m, w.n, dtype=out_dtype)
    fn, weights, threads = getattr(lib, _GEMM[w.format]), w.data.data_ptr(), torch.get_num_threads()
    x_ptr, y_ptr, y_bf16 = x.data_ptr(), y.data_ptr(), int(out_dtype == torch.bfloat16)
    rows = lib.rf_limits.max_rows
    for start in range(0, m, rows):  # (one pass for a decode batch of up to max_rows)
        fn(weights, x_ptr + start * w.k * x.element_size(), y_ptr + start * w.n * y.element_size(),
           y_bf16, min(rows, m - start), w.n, w.k, threads)
    return y


_GEMM = {fmt: f"rf_{fmt}_gemm" for fmt in abi.FORMATS}  # (gemm.c: one entry point each)


DEQUANT_BLOCK_BYTES = 1 << 20  # scratch of one block of dense rows (see gemm_dequant)
_scratch = threading.local()


def dequantize(w: TiledWeight, start: int = 0, rows: int | None = None,
               dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None
               ) -> torch.Tensor:
    """Rows [start, start + rows) of w's weights as a dense [rows, k] tensor of `dtype` (bf16
    or float32), bit for bit `unpack(w)[start:start + rows].to(dtype)`; `start` a multiple of
    TILE. `out`: a contiguous tensor of that shape and dtype to write into."""
    rows = w.n - start if rows is None else rows
    if start % TILE or start < 0 or rows < 0 or start + rows > w.n:
        raise ValueError(f"rows [{start}, {start + rows}) of {w.n}: the start must be a "
                         f"multiple of {TILE}")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    if out is None:
        out = torch.empty(rows, w.k, dtype=dtype)
    elif out.shape != (rows, w.k) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} [{rows}, {w.k}] tensor")
    lib = _library(w.level) if w.level else None
    if lib is None:
        out.copy_(_unpack_rows(w, start, rows))
    elif rows:
        lib.rf_dequant_rows(abi.FORMATS[w.format], w.data.data_ptr(), out.data_ptr(),
                            int(dtype == torch.bfloat16), start, rows, w.k,
                            torch.get_num_threads())
    return out


def _unpack_rows(w: TiledWeight, start: int, rows: int) -> torch.Tensor:
    t0, t1 = start // TILE, -(-(start + rows) // TILE)
    part = TiledWeight(w.format, w.data[t0:t1], min(w.n - t0 * TILE, (t1 - t0) * TILE), w.k,
                       w.level)
    return unpack(part)[:rows]


def block_rows(k: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Output rows per block of gemm_dequant: a multiple of TILE whose dense rows fill about
    DEQUANT_BLOCK_BYTES (a core's L2 holds it between the dequantization and the product;
    bench/results/dense-weights.md)."""
    per_row = k * torch.finfo(dtype).bits // 8
    return max(TILE, DEQUANT_BLOCK_BYTES // per_row // TILE * TILE)


def _scratch_for(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's reused buffer of at least `numel` elements of dtype."""
    held = getattr(_scratch, "buffers", None)
    if held is None:
        held = _scratch.buffers = {}
    buf = held.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = held[dtype] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


def gemm_dequant(x: torch.Tensor, w: TiledWeight, dtype: torch.dtype = torch.bfloat16,
                 bias: torch.Tensor | None = None, rows_per_block: int | None = None
                 ) -> torch.Tensor:
    """x [M, K] @ w.T (+ bias) -> [M, N] in `dtype` (bf16 or float32) for many rows, with no
    dense copy of w: blocks of output rows are dequantized (`dequantize`) into a scratch
    buffer kept per thread and multiplied with torch.mm (oneDNN) into the output's columns."""
    if x.dim() != 2 or x.shape[1] != w.k:
        raise ValueError(f"expected x of shape [M, {w.k}], got {tuple(x.shape)}")
    x = x.to(dtype)
    step = rows_per_block or block_rows(w.k, dtype)
    if step % TILE:
        raise ValueError(f"rows_per_block must be a multiple of {TILE}, got {step}")
    y = torch.empty(x.shape[0], w.n, dtype=dtype)
    scratch = _scratch_for(min(step, w.n) * w.k, dtype)
    bias = None if bias is None else bias.to(dtype)
    for start in range(0, w.n, step):
        rows = min(step, w.n - start)
        block = dequantize(w, start, rows, dtype, scratch[:rows * w.k].view(rows, w.k))
        if bias is None:
            torch.mm(x, block.t(), out=y[:, start:start + rows])
        else:
            torch.addmm(bias[start:start + rows], x, block.t(), out=y[:, start:start + rows])
    return y


def reference(x: torch.Tensor, w: TiledWeight) -> torch.Tensor:
    """gemm's torch reference: x rounded as gemm rounds it, fp32 products."""
    return _input(x, w).float() @ unpack(w).T


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) (the first largest value of each row, or its first NaN) for a float32
    CPU matrix, ~10 us over a 49k vocabulary where torch's takes 0.1-0.2 ms
    (bench/results/kernel-choices.md#2026-11-29-argmax)."""
    lib = _library()
    if lib is None or x.dim() != 2 or x.dtype != torch.float32 or not x.is_cpu \
            or not x.is_contiguous() or x.shape[1] == 0:
        return x.argmax(dim=-1)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.rf_argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], out.data_ptr())
    return out
