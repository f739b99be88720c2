"""The int8 KV cache's format (`--kv-cache-dtype int8`): each token's K (or V) slice of one KV
head is `head_dim` int8 codes and one fp16 scale, x ~= code * scale, symmetric, scale =
amax / 127 (llama.cpp's q8_0 cache and vLLM's fp8 cache scale per token and head too).

The scale is fp16 rather than fp32: 2 bytes a slice, so a token costs head_dim + 2 bytes a head
against bf16's 2 head_dim (1.94x the tokens at head_dim 64, 1.97x at 128, fp32 scales 1.88x);
fp16's range covers any K/V amax below 8e6, and its 11-bit precision is finer than the codes'.
Codes are rounded with the stored (fp16) scale, so code * scale is exactly what every reader
computes. The C decode step quantizes its own K/V in the same way (decode.c's store_kv).

Keys are quantized after a rotation by the orthonormal Hadamard matrix H (where head_dim is a
power of two; `rotate`), as QuaRot does for its int4 KV: a few outlier channels of a key set its
amax and leave the other channels a handful of codes; rotated, every channel carries a share of
them (the default model's mean |d logprob| against bf16 K/V: 0.032 unrotated, 0.019 rotated;
scales per 16 values instead: 0.020 for 4x the scale bytes). H is symmetric and H H = I, so
q . k = (q H) . (k H): readers rotate the queries (`rotate` again) and attend over the stored
keys as they are. Values are not rotated.

Keys are also stored centred: minus a per layer and KV head offset c (`key_offset`), the mean of
a calibration text's keys (runtime/kv_calibration.py, at start-up). Softmax gives every key a
query sees the same shift q . c, so attention is exactly unchanged and no reader changes; the
keys' common part no longer sets their scale (each key's error falls by about a third). c is
moved by less than half a code step so that the calibration's first key, the attention sink
most heads lean on (and the same key in every request that starts with the same token: a
chat template's first token, a BOS), is itself on the int8 grid and stored exactly. On a
chat prompt of the default model (dense weights) the mean |d logprob| against a bf16 KV cache
falls from 0.0188 to 0.0146 and top-1 agreement rises from 99.06% to 99.29%
(bench/results/int8-kv.md). Models whose scores are not a plain softmax's (Gemma 2's
soft-capped ones) keep c = 0.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

CODE_MAX = 127
SCALE_DTYPE = torch.float16


class QuantizedRows(NamedTuple):
    """One layer's K or V in an int8 pool."""

    codes: torch.Tensor  # int8 [num_slots, kv_heads, head_dim]
    scales: torch.Tensor  # fp16 [num_slots, kv_heads]

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.codes.dtype

    @property
    def device(self) -> torch.device:
        return self.codes.device


def is_rotated(head_dim: int) -> bool:
    """Whether keys of this head_dim are stored rotated (a power of two: H exists)."""
    return head_dim > 1 and head_dim & (head_dim - 1) == 0


@functools.lru_cache(maxsize=8)
def _hadamard(n: int, device: torch.device) -> torch.Tensor:
    """The orthonormal Hadamard matrix of order n (Sylvester's: [[H, H], [H, -H]] / sqrt 2)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n ** 0.5).float().to(device)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., head_dim] times H (in fp32, returned in x's dtype): keys before they are
    quantized, queries before they meet stored keys; x itself where head_dim is not a power
    of two."""
    d = x.shape[-1]
    if not is_rotated(d):
        return x
    return (x.float() @ _hadamard(d, x.device)).to(x.dtype)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] (any float dtype) -> (int8 codes [..., head_dim], fp16 scales [...])."""
    xf = x.float()
    scales = (xf.abs().amax(dim=-1) / CODE_MAX).to(SCALE_DTYPE)
    s = scales.float().unsqueeze(-1)
    codes = torch.where(s > 0, xf / torch.where(s > 0, s, 1.0), 0.0)
    return codes.round_().clamp_(-CODE_MAX, CODE_MAX).to(torch.int8), scales


def key_offset(keys: torch.Tensor) -> torch.Tensor:
    """One layer's calibration keys [tokens >= 2, kv_heads, head_dim], as stored before any
    offset (rotated), -> its offset c [kv_heads, head_dim] fp32: the mean of all keys but the
    first, moved so that first - c quantizes exactly (to the codes and scale of
    first - mean)."""
    keys = keys.float()
    first = keys[0]
    on_grid = dequantize(*quantize(first - keys[1:].mean(0)), torch.float32)
    return first - on_grid


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., head_dim] times scales [...] as `dtype` (multiplied in fp32)."""
    return (codes.float() * scales.float().unsqueeze(-1)).to(dtype)


def gather(rows: QuantizedRows, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows at slots [...] (any shape), dequantized: [..., kv_heads, head_dim] of `dtype`."""
    flat = slots.reshape(-1)
    out = dequantize(rows.codes.index_select(0, flat), rows.scales.index_select(0, flat), dtype)
    return out.view(*slots.shape, *rows.codes.shape[1:])


def run(rows: QuantizedRows, start: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Slots start .. start + n - 1, dequantized: [n, kv_heads, head_dim] of `dtype`."""
    return dequantize(rows.codes[start:start + n], rows.scales[start:start + n], dtype)
