"""Tiled weights for the CPU kernels' tests (kernels/cpu: tile_q4_1, tile_q6, tile_q8_0,
tile_bf16)
with the fp32 weights each must hold."""

from __future__ import annotations

import torch

from radixflow.kernels import cpu


def q4_1_groups(n: int, k: int, seed: int):
    """Q4_1 groups as a GGUF holds them: q in 0..15, fp16 scales and minimums."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen)
    scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
    low = (-torch.rand(n, k // 32, generator=gen) * 0.1).half().float()
    return q, scale, low


def tiled_weights(fmt: str, n: int, k: int, seed: int = 0) -> tuple[cpu.TiledWeight, torch.Tensor]:
    """A tiled weight and the fp32 weights it must hold."""
    if fmt == "q4_1":
        q, scale, low = q4_1_groups(n, k, seed)
        dense = low.repeat_interleave(32, 1) + q * scale.repeat_interleave(32, 1)
        return cpu.tile_q4_1(q, scale, low), dense
    gen = torch.Generator().manual_seed(seed)
    if fmt == "q6":  # Q6_K-like: q in -32..31, a scale per 16 (fp16, of either sign)
        q = torch.randint(-32, 32, (n, k), generator=gen, dtype=torch.int8)
        q[:, ::16] = -32  # the extremes of the grid
        q[:, 1::16] = 31
        scale = (torch.randn(n, k // 16, generator=gen) * 0.003).half().float()
        return cpu.tile_q6(q, scale), q.float() * scale.repeat_interleave(16, 1)
    if fmt == "q8_0":
        w = cpu.quantize_q8_0(torch.randn(n, k, generator=gen) * 0.05)
        return cpu.tile_q8_0(w), cpu.unpack_q8_0(w)
    dense = torch.randn(n, k, generator=gen).bfloat16().float()
    return cpu.tile_bf16(dense), dense
