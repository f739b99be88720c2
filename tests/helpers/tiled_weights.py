"""Tiled weights for the CPU kernels' tests (kernels/cpu: tile_q4_0, tile_q4_1, tile_q5_0,
tile_q5_1, tile_q2_k, tile_q3_k, tile_q4_k, tile_q5_k, tile_q6, tile_q6_k, tile_q8_0, tile_iq4_nl,
tile_iq4_xs, tile_bf16) with the fp32 weights each must hold."""

from __future__ import annotations

import torch

from radixflow.kernels import cpu

INTEGER_FORMATS = ["q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6", "q6_k",
                   "q8_0", "iq4_nl", "iq4_xs"]
# whole super-blocks of 256 along k
SUPER_BLOCK_FORMATS = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
FORMATS = [*INTEGER_FORMATS, "bf16"]


def cases(formats: list[str], shapes: list[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """(format, n, k) for each format and each shape whose k it holds (q4_k, q5_k, q6_k,
    iq4_xs: whole super-blocks of 256)."""
    return [(f, n, k) for f in formats for n, k in shapes
            if f not in SUPER_BLOCK_FORMATS or k % 256 == 0]


def q4_1_groups(n: int, k: int, seed: int):
    """Q4_1 groups as a GGUF holds them: q in 0..15, fp16 scales and minimums."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen)
    scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(n, k // 32, generator=gen) * 0.1).half().float()
    return q, scale, low


def tiled_weights(fmt: str, n: int, k: int, seed: int = 0) -> tuple[cpu.TiledWeight, torch.Tensor]:
    """A tiled weight and the fp32 weights it must hold."""
    if fmt == "q4_0":  # Q4_0's: q in 0..15, an fp16 d of either sign; w = d (q - 8)
        q, scale, _ = q4_1_groups(n, k, seed)
        scale = scale * torch.where(torch.arange(k // 32) % 3 == 0, -1.0, 1.0)
        dense = (q - 8).float() * scale.repeat_interleave(32, 1)
        return cpu.tile_q4_0(q, scale), dense
    if fmt in ("q5_0", "q5_1"):  # Q5_0's / Q5_1's: q in 0..31, fp16 d (and m)
        q, scale, low = q4_1_groups(n, k, seed)
        q = q + 16 * torch.randint(0, 2, q.shape, generator=torch.Generator().manual_seed(seed))
        if fmt == "q5_0":
            dense = (q - 16).float() * scale.repeat_interleave(32, 1)
            return cpu.tile_q5_0(q, scale), dense
        dense = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
        return cpu.tile_q5_1(q, scale, low), dense
    if fmt == "iq4_nl":  # IQ4_NL's: indices 0..15 into the values, an fp16 d of either sign
        q, scale, _ = q4_1_groups(n, k, seed)
        scale = scale * torch.where(torch.arange(k // 32) % 3 == 0, -1.0, 1.0)
        dense = cpu.IQ4_VALUES[q] * scale.repeat_interleave(32, 1)
        return cpu.tile_iq4_nl(q, scale), dense
    if fmt == "iq4_xs":  # IQ4_XS's fields: scales ls - 32 in -32..31 (the extremes too)
        gen = torch.Generator().manual_seed(seed)
        q = torch.randint(0, 16, (n, k), generator=gen)
        sc = torch.randint(-32, 32, (n, k // 32), generator=gen)
        sc[:, 0], sc[:, -1] = -32, 31
        d = (torch.rand(n, k // 256, generator=gen) * 2e-4).half().float()
        scale = (d.repeat_interleave(8, 1) * sc.float()).repeat_interleave(32, 1)
        return cpu.tile_iq4_xs(q, sc, d), cpu.IQ4_VALUES[q] * scale
    if fmt == "q4_1":
        q, scale, low = q4_1_groups(n, k, seed)
        dense = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
        return cpu.tile_q4_1(q, scale, low), dense
    gen = torch.Generator().manual_seed(seed)
    if fmt in ("q4_k", "q5_k"):  # Q4_K's / Q5_K's fields: six-bit scales and mins (the
        q = torch.randint(0, 16 if fmt == "q4_k" else 32, (n, k), generator=gen,  # extremes too)
                          dtype=torch.uint8)
        sc = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
        mn = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
        sc[:, 0], mn[:, 0], sc[:, -1], mn[:, -1] = 63, 0, 0, 63
        d = (torch.rand(n, k // 256, generator=gen) * 4e-4).half().float()
        dmin = (torch.rand(n, k // 256, generator=gen) * 2e-3).half().float()
        scale = (d.repeat_interleave(8, 1) * sc.float()).repeat_interleave(32, 1)
        low = (dmin.repeat_interleave(8, 1) * mn.float()).repeat_interleave(32, 1)
        tile = cpu.tile_q4_k if fmt == "q4_k" else cpu.tile_q5_k
        return tile(q, sc, mn, d, dmin), q.float() * scale - low
    if fmt == "q6":  # Q6_K-like: q in -32..31, a scale per 16 (fp16, of either sign)
        q = torch.randint(-32, 32, (n, k), generator=gen, dtype=torch.int8)
        q[:, ::16] = -32  # the extremes of the grid
        q[:, 1::16] = 31
        scale = (torch.randn(n, k // 16, generator=gen) * 0.003).half().float()
        return cpu.tile_q6(q, scale), q.float() * scale.repeat_interleave(16, 1)
    if fmt == "q6_k":  # Q6_K's fields: int8 scales of either sign, the extremes included
        q = torch.randint(-32, 32, (n, k), generator=gen, dtype=torch.int8)
        q[:, ::16], q[:, 1::16] = -32, 31
        sc = torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8)
        sc[:, 0], sc[:, -1] = 127, -128
        d = (torch.rand(n, k // 256, generator=gen) * 4e-5).half().float()
        scale = (d.repeat_interleave(16, 1) * sc.float()).repeat_interleave(16, 1)
        return cpu.tile_q6_k(q, sc, d), q.float() * scale
    if fmt == "q2_k":  # Q2_K's fields: q in 0..3, 4-bit scales and mins (the extremes too)
        q = torch.randint(0, 4, (n, k), generator=gen, dtype=torch.uint8)
        sc = torch.randint(0, 16, (n, k // 16), generator=gen, dtype=torch.uint8)
        mn = torch.randint(0, 16, (n, k // 16), generator=gen, dtype=torch.uint8)
        sc[:, 0], mn[:, 0], sc[:, -1], mn[:, -1] = 15, 0, 0, 15
        d = (torch.rand(n, k // 256, generator=gen) * 2e-3).half().float()
        dmin = (torch.rand(n, k // 256, generator=gen) * 2e-3).half().float()
        scale = (d.repeat_interleave(16, 1) * sc.float()).repeat_interleave(16, 1)
        low = (dmin.repeat_interleave(16, 1) * mn.float()).repeat_interleave(16, 1)
        return cpu.tile_q2_k(q, sc, mn, d, dmin), scale * q.float() - low
    if fmt == "q3_k":  # Q3_K's fields: q in -4..3, scales in -32..31 (the extremes too)
        q = torch.randint(-4, 4, (n, k), generator=gen, dtype=torch.int8)
        q[:, ::16], q[:, 1::16] = -4, 3
        sc = torch.randint(-32, 32, (n, k // 16), generator=gen, dtype=torch.int8)
        sc[:, 0], sc[:, -1] = 31, -32
        d = (torch.rand(n, k // 256, generator=gen) * 4e-4).half().float()
        scale = (d.repeat_interleave(16, 1) * sc.float()).repeat_interleave(16, 1)
        return cpu.tile_q3_k(q, sc, d), q.float() * scale
    if fmt == "q8_0":
        w = cpu.quantize_q8_0(torch.randn(n, k, generator=gen) * 0.05)
        return cpu.tile_q8_0(w), cpu.unpack_q8_0(w)
    dense = torch.randn(n, k, generator=gen).bfloat16().float()
    return cpu.tile_bf16(dense), dense
