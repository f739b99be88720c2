"""One request's causal attention over its new tokens (a prompt, or a chunk of one after a
cached prefix) with the CPU kernels' rf_prefill_attention, over the bf16 KV pool in place.

Per KV head, a tile of tokens x the query heads of its group runs against each block of 64
keys as one product (each loaded key feeds every query of the tile), with an online softmax;
only the blocks that straddle the tile's diagonal are masked, and the blocks past it are never
visited. Each level takes the model dtype it runs: bf16 at avx512 (vdpbf16ps, 128 queries a
tile), fp32 at avx2 (FMA, K/V widened from bf16, 96 queries a tile). torch's flash attention
for the CPU runs 2-3.5x slower (bench/results/prefill-attention-*.md).

`reference` is the torch computation the tests compare against.
"""

from __future__ import annotations

import ctypes
import math

import torch
import torch.nn.functional as F

from . import _library, active_level
from .abi import Prefill

# the dtype of q and out in each level's build, and what head_dim must be a multiple of
_LEVELS = {"avx512": (torch.bfloat16, 4), "avx2": (torch.float32, 16)}
# new tokens x keys below which torch's flash attention is as fast (its fp32 path at avx2:
# bench/results/prefill-attention-avx2-2026-12-02.md; at avx512 the kernel wins from 16 x 1000)
MIN_PAIRS = {"avx512": 0, "avx2": 1 << 16}


def worth_it(new: int, prefix: int, level: str) -> bool:
    """Whether the kernel of `level` beats torch's for `new` tokens after `prefix`."""
    return new * (prefix + new) >= MIN_PAIRS[level]


def _kernel(level: str | None = None):
    lib = _library(level)
    fn = getattr(lib, "rf_prefill_attention", None) if lib is not None else None
    if fn is not None and fn.restype is not ctypes.c_int64:
        fn.argtypes = [ctypes.POINTER(Prefill)]
        fn.restype = ctypes.c_int64
    return fn


def io_dtype(level: str | None = None) -> torch.dtype | None:
    """The dtype of queries and outputs the kernel of `level` (default: the level in force)
    takes, or None where there is none."""
    level = level or active_level()
    return _LEVELS[level][0] if level in _LEVELS and _kernel(level) is not None else None


def supported(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              level: str | None = None) -> bool:
    """Whether the kernel of `level` (default: the level in force) takes attention of this
    shape with `dtype` queries."""
    level = level or active_level()
    if dtype != io_dtype(level):
        return False
    limits = _library(level).rf_limits
    return (kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= limits.max_group
            and head_dim % _LEVELS[level][1] == 0 and head_dim <= limits.max_head_dim)


def prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      slots: torch.Tensor, prefix: int, scale: float,
                      out: torch.Tensor | None = None,
                      level: str | None = None) -> torch.Tensor:
    """q [n, heads, head_dim] in io_dtype(level) (rows may be strided, heads contiguous) at
    positions prefix .. prefix + n - 1; k_pool / v_pool [num_slots, kv_heads, head_dim] bf16; slots
    [prefix + n] int64, the request's KV slots (its new tokens' K/V already written). Returns
    (or fills `out`, [n, heads, head_dim] of q's dtype, heads contiguous) each token's attention
    over positions 0 .. its own. level: the build to run (default: the level in force)."""
    level = level or active_level()
    fn = _kernel(level)
    if fn is None:
        raise RuntimeError("the prefill attention kernel needs the CPU kernels' avx512 or "
                           "avx2 build")
    n, heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    want = io_dtype(level)
    if q.dtype != want or k_pool.dtype != torch.bfloat16 or v_pool.dtype != torch.bfloat16:
        raise ValueError(f"prefill_attention takes {want} queries here (the "
                         f"{level} build) and a bf16 KV pool")
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        raise ValueError("q's heads must be contiguous within a row")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()) or k_pool.shape != v_pool.shape \
            or k_pool.shape[2] != head_dim:
        raise ValueError("k_pool and v_pool must be contiguous [num_slots, kv_heads, head_dim]")
    slots = slots.to(torch.int64).contiguous()
    if slots.dim() != 1 or slots.numel() != prefix + n:
        raise ValueError(f"expected {prefix + n} slots, got {tuple(slots.shape)}")
    if out is None:
        out = torch.empty(n, heads, head_dim, dtype=want)
    if out.dtype != want or out.shape != q.shape or out.stride(2) != 1 or out.stride(1) != head_dim:
        raise ValueError("out must be [n, heads, head_dim] of q's dtype, heads contiguous")
    job = Prefill(n=n, prefix=prefix, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                  q_stride=q.stride(0), out_stride=out.stride(0),
                  nthreads=torch.get_num_threads(), scale=scale, q=q.data_ptr(),
                  k=k_pool.data_ptr(), v=v_pool.data_ptr(), slots=slots.data_ptr(),
                  out=out.data_ptr())
    status = fn(ctypes.byref(job))
    if status == -1:
        raise ValueError(f"prefill_attention does not take heads={heads}, kv_heads={kv_heads}, "
                         f"head_dim={head_dim}")
    if status != 0:
        raise MemoryError("prefill_attention could not allocate its work buffers")
    return out


def reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
              prefix: int, scale: float | None = None) -> torch.Tensor:
    """prefill_attention in fp32 torch ops: [n, heads, head_dim] fp32."""
    n, heads, head_dim = q.shape
    scale = 1 / math.sqrt(head_dim) if scale is None else scale
    keys = k_pool[slots.long()].float().transpose(0, 1)  # [kv_heads, prefix + n, d]
    values = v_pool[slots.long()].float().transpose(0, 1)
    visible = torch.arange(prefix + n)[None, :] <= prefix + torch.arange(n)[:, None]
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), keys, values,
                                         attn_mask=visible, scale=scale,
                                         enable_gqa=heads != k_pool.shape[1])
    return out.transpose(0, 1)
