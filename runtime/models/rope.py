"""Rotary position embeddings (HF's rotate-half layout) and their scalings, as transformers'
`modeling_rope_utils.ROPE_INIT_FUNCTIONS` computes them: linear, dynamic (NTK), yarn,
longrope (Phi-3's `su`) and llama3. The scaling dict is rope_scaling.py's normalised one.

Each scaling gives inverse frequencies and an attention factor; the factor (YaRN's mscale,
longrope's sqrt(1 + log s / log L)) multiplies cos and sin, as transformers does, and is folded
into the tables here, so every path that reads them -- `apply_rope`, the C row kernel
(`RowKernels.rope_`), the C decode step (which indexes `cos`/`sin`), the compiled decode and
tensor-parallel ranks -- gets it without knowing about it. No path computes its own theta.

Two scalings depend on the sequence length in transformers; radixflow's positions are absolute
and the radix cache shares rotated keys between requests, so each table is fixed at start-up:

- longrope: transformers uses `long_factor` for a forward whose sequence exceeds
  `original_max_position_embeddings`, `short_factor` otherwise (and keeps the keys it cached
  before the switch). radixflow does what vLLM does: long factors for every position when the
  served context (`--context-length`, else max_position_embeddings) exceeds the original
  length, short factors otherwise (llama.cpp chooses the same way, by n_ctx). This equals
  transformers for every sequence on a short-context server, and for every sequence longer
  than the original length on a long-context one; only short prompts on a long-context
  server differ (they get long factors, which keeps cached keys valid when they grow).
- dynamic NTK: transformers leaves inv_freq unscaled up to max_position_embeddings and grows
  the base once a sequence passes it. radixflow never serves past max_position_embeddings
  for dynamic (rope_scaling.py), so its table is exactly transformers' for every sequence it
  runs -- not vLLM's fixed base for max_position_embeddings * factor, which differs from
  transformers at every length. A table built longer than that (only by hand) uses the base
  for its full length.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def base_inv_freq(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    # long wavelengths slowed by `factor`, short ones kept, the band between blended
    factor = float(s["factor"])
    low_freq_factor = float(s.get("low_freq_factor", 1.0))
    high_freq_factor = float(s.get("high_freq_factor", 4.0))
    old_context = float(s["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, theta: float, s: dict[str, Any]) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor")
    if factor is None:  # DeepSeek-V3 style: the ratio of the two lengths
        factor = s["max_position_embeddings"] / original
    factor = float(factor)
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = s.get("beta_fast") or 32
    beta_slow = s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:  # the dim that turns `rotations` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no singularity
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = base_inv_freq(dim, theta)
    extrapolation_weight = 1 - ramp
    inv_freq = (extrapolation / factor) * ramp + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)


def _longrope(dim: int, theta: float, s: dict[str, Any],
              context_len: int) -> tuple[torch.Tensor, float]:
    original = s["original_max_position_embeddings"]
    factor = s.get("factor")
    if factor is None:  # Phi-3: the ratio of the two lengths
        factor = s["max_position_embeddings"] / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1.0
                            else math.sqrt(1 + math.log(factor) / math.log(original)))
    which = "long_factor" if context_len > original else "short_factor"
    ext = torch.tensor(s[which], dtype=torch.float64)
    if ext.shape != (dim // 2,):
        raise ValueError(f"rope scaling longrope: {which} has {ext.numel()} entries, the "
                         f"rotary dimension {dim} needs {dim // 2}")
    return 1.0 / (ext * theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)), \
        float(attention_factor)


def _dynamic(dim: int, theta: float, s: dict[str, Any], seq_len: int) -> torch.Tensor:
    factor, max_pos = float(s["factor"]), s["max_position_embeddings"]
    seq_len = max(seq_len, max_pos)
    base = theta * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return base_inv_freq(dim, base)


def rope_frequencies(dim: int, theta: float, scaling: dict[str, Any] | None, *,
                     seq_len: int, context_len: int | None = None
                     ) -> tuple[torch.Tensor, float]:
    """float64 inverse frequencies [dim // 2] and the attention factor for a table of
    `seq_len` positions serving sequences of up to `context_len` (default seq_len)."""
    context_len = context_len or seq_len
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return base_inv_freq(dim, theta), 1.0
    if kind == "linear":
        return base_inv_freq(dim, theta) / float(scaling["factor"]), 1.0
    if kind == "llama3":
        return llama3_inv_freq(base_inv_freq(dim, theta), scaling), 1.0
    if kind == "yarn":
        return _yarn(dim, theta, scaling)
    if kind in ("longrope", "su"):
        return _longrope(dim, theta, scaling, context_len)
    if kind == "dynamic":
        return _dynamic(dim, theta, scaling, seq_len), 1.0
    raise ValueError(f"unsupported rope scaling type {kind!r}")


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """The inverse frequencies alone (a table of the config's length)."""
    seq_len = (scaling or {}).get("max_position_embeddings", 0)
    return rope_frequencies(head_dim, theta, scaling, seq_len=seq_len)[0]


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, head_dim: int, max_positions: int, theta: float,
                 scaling: dict[str, Any] | None):
        super().__init__()
        self.head_dim, self.max_positions, self.theta, self.scaling = (
            head_dim, max_positions, theta, scaling)
        self.context_len: int | None = None  # served context (longrope's choice); None: all
        self.attention_factor = 1.0
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        if self.cos.device.type != "meta":  # built on 'meta': the loader calls reset_tables
            self.reset_tables()

    def reset_tables(self, device: torch.device | str | None = None, *,
                     context_len: int | None = None) -> None:
        """(Re)compute the fp32 cos/sin tables, e.g. after building the model on 'meta';
        `context_len`: the longest sequence the server runs (longrope picks its factors by
        it; kept for later calls), default max_positions."""
        device = device or self.cos.device
        if context_len is not None:
            self.context_len = context_len
        inv_freq, self.attention_factor = rope_frequencies(
            self.head_dim, self.theta, self.scaling, seq_len=self.max_positions,
            context_len=self.context_len)
        # positions the server can reach only (a 131,072-position table of Llama 3 took
        # ~0.6 s to make, twice, at each start, when a KV pool serves 32,768)
        rows = min(self.context_len or self.max_positions, self.max_positions)
        freqs = torch.outer(torch.arange(rows, dtype=torch.float64), inv_freq)
        # [rows, head_dim]: cos and sin halves repeated, HF rotate-half convention
        cos = (freqs.cos() * self.attention_factor).float()
        sin = (freqs.sin() * self.attention_factor).float()
        self.cos = torch.cat([cos, cos], dim=-1).to(device)
        self.sin = torch.cat([sin, sin], dim=-1).to(device)

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
