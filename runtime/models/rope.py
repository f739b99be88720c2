"""Rotary position embeddings (HF's rotate-half layout), with Llama 3 and linear scaling."""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None):
        super().__init__()
        self.head_dim, self.max_positions, self.theta, self.scaling = (
            head_dim, max_positions, theta, scaling)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        if self.cos.device.type != "meta":  # built on 'meta': the loader calls reset_tables
            self.reset_tables()

    def reset_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the fp32 cos/sin tables, e.g. after building the model on 'meta'."""
        device = device or self.cos.device
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling)
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float64), inv_freq)
        # [max_positions, head_dim]: cos and sin halves repeated, HF rotate-half convention
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().float().to(device)
        self.sin = emb.sin().float().to(device)

    def tables(self, positions: torch.Tensor,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin for these positions, [num_tokens, 1, head_dim], once per
        forward."""
        cos = self.cos[positions].unsqueeze(1).to(dtype)
        sin = self.sin[positions]
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_lo, sin_hi]
        signed_sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).unsqueeze(1).to(dtype)
        return cos, signed_sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    # x: [num_tokens, heads, head_dim]
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin
