"""Pieces the Triton attention kernels share."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kv_int8 import QuantizedRows


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with an fp32 accumulator. UPCAST multiplies in fp32 (for the interpreter)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=PRECISION)


def dot_options(x: torch.Tensor) -> dict[str, object]:
    """PRECISION / UPCAST for tiles of x's dtype on x's device."""
    # NOTE: triton's interpreter multiplies bf16/fp16 tiles as their raw integer storage
    # (create_dot on uint16 arrays), so off the GPU tiles are upcast to fp32 first; the values
    # are the same, already rounded to x's dtype, so the math matches the GPU's.
    # fp32 inputs: three tf32 products (tf32x3) give fp32-level accuracy on the tensor cores.
    return {"PRECISION": "tf32x3" if x.dtype == torch.float32 else "tf32",
            "UPCAST": not x.is_cuda}


def needs_int64(*tensors: torch.Tensor) -> bool:
    """Whether element offsets into any of these tensors can pass int32 (32-bit offsets keep
    the gathered tiles' address math in half the registers)."""
    return any(t.numel() >= 2**31 for t in tensors)


@triton.jit
def dequantize_keys(k, Scale, slots, stride_s, mask_n, dtype: tl.constexpr):
    """An int8 cache's key tile [BLOCK_D, BLOCK_N] (codes) times each key's scale, as dtype."""
    scale = tl.load(Scale + slots * stride_s, mask=mask_n, other=0.0).to(tl.float32)
    return (k.to(tl.float32) * scale[None, :]).to(dtype)


@triton.jit
def dequantize_values(v, Scale, slots, stride_s, mask_n, dtype: tl.constexpr):
    """An int8 cache's value tile [BLOCK_N, BLOCK_D] (codes) times each key's scale, as dtype."""
    scale = tl.load(Scale + slots * stride_s, mask=mask_n, other=0.0).to(tl.float32)
    return (v.to(tl.float32) * scale[:, None]).to(dtype)


def kv_tensors(k_cache, v_cache):
    """((K tensor, its scales), (V tensor, its scales), is_int8) for the kernels: an int8
    pool's codes and scales (kernels/kv_int8.py), or a float pool's tensors (standing in for
    the scales the kernels then never read)."""
    is_int8 = isinstance(k_cache, QuantizedRows)
    if is_int8 != isinstance(v_cache, QuantizedRows):
        raise ValueError("K and V caches must both be int8 (QuantizedRows) or both float")
    if is_int8:
        return tuple(k_cache), tuple(v_cache), True
    return (k_cache, k_cache), (v_cache, v_cache), False
