"""Random GGUF blocks that exercise every field: each byte column through all 256 values,
the fp16 fields through finite patterns led by the edge cases (tests of gguf_blocks and of the
C repack)."""

from __future__ import annotations

import numpy as np

from radixflow.kernels import gguf_blocks as gb

# Byte offsets of each type's fp16 fields (d, dmin / m) inside a block.
HALVES = {"F16": [0], "BF16": [], "F32": [], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0],
          "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2],
          "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0]}
N_BLOCKS = 1024


def finite_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random finite fp16 bit patterns, led by the edge cases (zeros, subnormals, the max)."""
    h = rng.integers(0, 1 << 16, n, dtype=np.uint16)
    h = np.where((h & 0x7C00) == 0x7C00, h & ~np.uint16(0x4000), h).astype(np.uint16)
    edges = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00],
                     dtype=np.uint16)
    h[:len(edges)] = edges
    return h


def covering_blocks(name: str, n: int = N_BLOCKS, seed: int = 0) -> np.ndarray:
    """uint8 [n, type_size]: each byte column runs through all 256 values (n / 256 times, in a
    random order of its own), then the fp16 fields are overwritten with finite values."""
    rng = np.random.default_rng(seed)
    size = gb.QUANT_SIZES[gb.GGMLType[name]][1]
    raw = np.concatenate([np.argsort(rng.random((256, size)), axis=0).astype(np.uint8)
                          for _ in range(n // 256)], axis=0)
    for at in HALVES[name]:
        raw[:, at:at + 2] = finite_halves(rng, n).view(np.uint8).reshape(n, 2)
    return np.ascontiguousarray(raw)


def quantize_q4_k(w: np.ndarray, bits: int = 4) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) -> Q4_K blocks, uint8 [rows, cols / 256 *
    144] (bits=5: Q5_K blocks, cols / 256 * 176): a plain min/max quantizer (not llama.cpp's
    search), for test files; the `gguf` package quantizes no K-quant type."""
    rows, cols = w.shape
    top = (1 << bits) - 1
    sub = w.astype(np.float32).reshape(rows, cols // 256, 8, 32)
    low = np.maximum(-sub.min(-1), 0)  # x = d sc q - dmin m, so m >= 0
    step = (sub.max(-1) + low) / top
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = (low.max(-1) / 63).astype(np.float16)
    safe = lambda v: np.where(v > 0, v, 1)  # noqa: E731
    sc = np.clip(np.rint(step / safe(d.astype(np.float32))[..., None]), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(low / safe(dmin.astype(np.float32))[..., None]), 0, 63).astype(np.uint8)
    scale = d.astype(np.float32)[..., None] * sc
    offset = dmin.astype(np.float32)[..., None] * m
    q = np.rint((sub + offset[..., None]) / safe(scale)[..., None])
    q = np.clip(q, 0, top).astype(np.uint8)
    packed = np.zeros((rows, cols // 256, 12), dtype=np.uint8)
    packed[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    fifth = [(q[..., j, :] >> 4) << j for j in range(8)]  # Q5_K: bit j of qh[l]
    qh = np.bitwise_or.reduce(np.stack(fifth), axis=0).astype(np.uint8)  # [.., 32]
    q = (q & 15).reshape(rows, cols // 256, 4, 2, 32)  # [.., 64-chunk c, half n, l]
    qs = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(rows, cols // 256, 128)
    fields = [d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), packed]
    blocks = np.concatenate([*fields, *([qh] if bits == 5 else []), qs], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) -> Q6_K blocks, uint8 [rows, cols / 256 *
    210]: a plain max-abs quantizer (not llama.cpp's search), for test files."""
    rows, cols = w.shape
    sub = w.astype(np.float32).reshape(rows, cols // 256, 16, 16)
    step = np.abs(sub).max(-1) / 31  # per 16
    d = (np.abs(step).max(-1) / 127).astype(np.float16)
    safe = lambda v: np.where(v > 0, v, 1)  # noqa: E731
    sc = np.clip(np.rint(step / safe(d.astype(np.float32))[..., None]), -128, 127).astype(np.int8)
    scale = d.astype(np.float32)[..., None] * sc
    q = np.clip(np.rint(sub / safe(scale)[..., None]), -32, 31).astype(np.int16) + 32
    q = q.reshape(rows, cols // 256, 2, 4, 32).astype(np.uint8)  # [.., 128-half n, quarter, l]
    low = q & 15
    ql = np.concatenate([low[..., 0, :] | (low[..., 2, :] << 4),
                         low[..., 1, :] | (low[..., 3, :] << 4)], axis=-1)  # [.., n, 64]
    qh = (q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << 2) | ((q[..., 2, :] >> 4) << 4) \
        | ((q[..., 3, :] >> 4) << 6)  # [.., n, 32]
    blocks = np.concatenate([ql.reshape(rows, cols // 256, 128), qh.reshape(rows, cols // 256, 64),
                             sc.view(np.uint8), d[..., None].view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def quantize_iq4(w: np.ndarray, xs: bool = False) -> np.ndarray:
    """float32 [rows, cols] -> IQ4_NL blocks (cols a multiple of 32: uint8 [rows, cols / 32 *
    18]) or, xs, IQ4_XS blocks (cols a multiple of 256: [rows, cols / 256 * 136]): each weight
    the nearest of its group's scale times the 16 values (not llama.cpp's search), for test
    files."""
    rows, cols = w.shape
    values = np.array(gb.KVALUES_IQ4NL, dtype=np.float32)
    groups = w.astype(np.float32).reshape(rows, -1, 32)
    step = np.abs(groups).max(-1) / 127  # per group of 32
    safe = lambda v: np.where(v != 0, v, 1)  # noqa: E731
    if xs:  # a d per 256 and a six-bit ls per 32 (scale d (ls - 32), here ls - 32 >= 0)
        per_super = step.reshape(rows, cols // 256, 8)
        d = (per_super.max(-1) / 31).astype(np.float16)
        sc = np.clip(np.rint(per_super / safe(d.astype(np.float32))[..., None]), 0, 31)
        scale = (d.astype(np.float32)[..., None] * sc).reshape(rows, -1)
    else:
        d = step.astype(np.float16)
        scale = d.astype(np.float32)
    q = np.abs(groups[..., None] / safe(scale)[..., None, None] - values).argmin(-1)
    qs = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)  # [rows, groups, 16]
    if not xs:
        blocks = np.concatenate([d[..., None].view(np.uint8), qs], axis=-1)
        return np.ascontiguousarray(blocks.reshape(rows, -1))
    ls = (sc + 32).astype(np.uint16)  # [rows, supers, 8]
    scales_h = np.bitwise_or.reduce((ls >> 4) << (2 * np.arange(8, dtype=np.uint16)), axis=-1)
    scales_l = ((ls[..., 0::2] & 15) | ((ls[..., 1::2] & 15) << 4)).astype(np.uint8)
    blocks = np.concatenate([d[..., None].view(np.uint8),
                             scales_h.astype(np.uint16)[..., None].view(np.uint8), scales_l,
                             qs.reshape(rows, cols // 256, 128)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def quantize_q3_k(w: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) -> Q3_K blocks, uint8 [rows, cols / 256 *
    110]: a plain max-abs quantizer (not llama.cpp's search), for test files."""
    rows, cols = w.shape
    sub = w.astype(np.float32).reshape(rows, cols // 256, 16, 16)
    step = np.abs(sub).max(-1) / 4  # per 16: q in -4..3
    d = (step.max(-1) / 31).astype(np.float16)
    safe = lambda v: np.where(v != 0, v, 1)  # noqa: E731
    sc = np.clip(np.rint(step / safe(d.astype(np.float32))[..., None]), -32, 31).astype(np.int16)
    scale = d.astype(np.float32)[..., None] * sc
    q = np.clip(np.rint(sub / safe(scale)[..., None]), -4, 3).astype(np.int16)
    u = (q + 4).reshape(rows, cols // 256, 2, 4, 32).astype(np.uint8)  # [.., n, j, l]
    hmask = np.bitwise_or.reduce(
        (u >> 2) << (4 * np.arange(2)[:, None, None] + np.arange(4)[:, None]).astype(np.uint8),
        axis=(2, 3)).astype(np.uint8)  # [.., 32]: bit 4 n + j
    qs = np.bitwise_or.reduce((u & 3) << (2 * np.arange(4)[:, None]).astype(np.uint8),
                              axis=3).astype(np.uint8).reshape(rows, cols // 256, 64)
    ls = (sc + 32).astype(np.uint8)  # [.., 16]
    s = np.zeros((rows, cols // 256, 12), dtype=np.uint8)
    s[..., 0:8] = (ls[..., 0:8] & 15) | ((ls[..., 8:16] & 15) << 4)
    for i in range(16):
        s[..., 8 + i % 4] |= (ls[..., i] >> 4) << (2 * (i // 4))
    blocks = np.concatenate([hmask, qs, s, d[..., None].view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def quantize_q2_k(w: np.ndarray) -> np.ndarray:
    """float32 [rows, cols] (cols a multiple of 256) -> Q2_K blocks, uint8 [rows, cols / 256 *
    84]: a plain min/max quantizer (not llama.cpp's search), for test files."""
    rows, cols = w.shape
    sub = w.astype(np.float32).reshape(rows, cols // 256, 16, 16)
    low = np.maximum(-sub.min(-1), 0)  # x = d sc q - dmin m, so m >= 0
    step = (sub.max(-1) + low) / 3
    d = (step.max(-1) / 15).astype(np.float16)
    dmin = (low.max(-1) / 15).astype(np.float16)
    safe = lambda v: np.where(v > 0, v, 1)  # noqa: E731
    sc = np.clip(np.rint(step / safe(d.astype(np.float32))[..., None]), 0, 15).astype(np.uint8)
    m = np.clip(np.rint(low / safe(dmin.astype(np.float32))[..., None]), 0, 15).astype(np.uint8)
    scale = d.astype(np.float32)[..., None] * sc
    offset = dmin.astype(np.float32)[..., None] * m
    q = np.clip(np.rint((sub + offset[..., None]) / safe(scale)[..., None]), 0, 3).astype(np.uint8)
    q = q.reshape(rows, cols // 256, 2, 4, 32)  # [.., n, j, l]: w[128 n + 32 j + l]
    qs = np.bitwise_or.reduce(q << (2 * np.arange(4)[:, None]).astype(np.uint8), axis=3)
    blocks = np.concatenate([sc | (m << 4), qs.astype(np.uint8).reshape(rows, cols // 256, 64),
                             d[..., None].view(np.uint8), dmin[..., None].view(np.uint8)], axis=-1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))
