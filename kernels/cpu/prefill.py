"""One request's causal attention over its new tokens (a prompt, or a chunk of one after a
cached prefix) with the avx512 build's kernel (step_avx512.c: rf_prefill_attention).

Per KV head, a tile of tokens x the query heads of its group (up to 128 queries) runs against
each block of 64 keys as one product in vdpbf16ps (each loaded key feeds every query of the
tile), with an online softmax; only the blocks that straddle the tile's diagonal are masked,
and the blocks past it are never visited. torch's flash attention for the CPU does the same
in bf16 at about a third of the speed on AVX-512 BF16 machines (bench/results).

`reference` is the torch computation the tests compare against.
"""

from __future__ import annotations

import ctypes
import math

import torch
import torch.nn.functional as F

from . import _library
from .abi import Prefill


def _kernel():
    lib = _library()
    fn = getattr(lib, "rf_prefill_attention", None) if lib is not None else None
    if fn is not None and fn.restype is not ctypes.c_int64:
        fn.argtypes = [ctypes.POINTER(Prefill)]
        fn.restype = ctypes.c_int64
    return fn


def supported(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether this machine's kernels take attention of this shape (bf16 only)."""
    if dtype != torch.bfloat16 or _kernel() is None:
        return False
    limits = _library().rf_limits
    return (kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= limits.max_group
            and head_dim % 4 == 0 and head_dim <= limits.max_head_dim)


def prefill_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      slots: torch.Tensor, prefix: int, scale: float,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """q [n, heads, head_dim] bf16 (rows may be strided, heads contiguous) at positions
    prefix .. prefix + n - 1; k_pool / v_pool [num_slots, kv_heads, head_dim] bf16; slots
    [prefix + n] int64, the request's KV slots (its new tokens' K/V already written). Returns
    (or fills `out`, [n, heads, head_dim] bf16 with contiguous rows) each token's attention
    over positions 0 .. its own."""
    fn = _kernel()
    if fn is None:
        raise RuntimeError("the prefill attention kernel needs the avx512 build of the CPU kernels")
    n, heads, head_dim = q.shape
    kv_heads = k_pool.shape[1]
    if any(t.dtype != torch.bfloat16 for t in (q, k_pool, v_pool)):
        raise ValueError("prefill_attention takes bf16 queries and a bf16 KV pool")
    if q.stride(2) != 1 or q.stride(1) != head_dim:
        raise ValueError("q's heads must be contiguous within a row")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()) or k_pool.shape != v_pool.shape \
            or k_pool.shape[2] != head_dim:
        raise ValueError("k_pool and v_pool must be contiguous [num_slots, kv_heads, head_dim]")
    slots = slots.to(torch.int64).contiguous()
    if slots.dim() != 1 or slots.numel() != prefix + n:
        raise ValueError(f"expected {prefix + n} slots, got {tuple(slots.shape)}")
    if out is None:
        out = torch.empty(n, heads, head_dim, dtype=torch.bfloat16)
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
