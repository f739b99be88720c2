"""One request's causal attention over its new tokens (a prompt, or a chunk of one after a
cached prefix) with the CPU kernels' rf_prefill_attention, over the bf16 KV pool in place (or
an int8 one: each block of keys dequantized into scratch as it is read).

Per KV head, a tile of tokens x the query heads of its group runs against each block of 64
keys as one product (each loaded key feeds every query of the tile), with an online softmax;
only the blocks that straddle the tile's diagonal are masked, and the blocks past it are never
visited. Each level takes the model dtype it runs: bf16 at avx512 (vdpbf16ps, 128 queries a
tile), fp32 at avx2 (FMA, K/V widened from bf16, 96 queries a tile). torch's flash attention
for the CPU runs 2-3.5x slower (bench/results/prefill-attention.md).

`reference` is the torch computation the tests compare against.
"""

from __future__ import annotations

import ctypes
import math

import torch
import torch.nn.functional as F

from ..kv_int8 import QuantizedRows
from ..kv_int8 import gather as _gather_int8
from . import _library, active_level
from .abi import Prefill

# the dtype of q and out in each level's build (the model dtype each level runs)
_IO_DTYPE = {"avx512": torch.bfloat16, "avx2": torch.float32}
# new tokens x keys below which torch's flash attention is as fast (its fp32 path at avx2; at
# avx512 the kernel wins from 16 x 1000: bench/results/prefill-attention.md#2026-12-02-avx2 and
# #2026-12-02-avx512)
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
    return _IO_DTYPE.get(level) if _kernel(level) is not None else None


def supported(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
              level: str | None = None) -> bool:
    """Whether the kernel of `level` (default: the level in force) takes attention of this
    shape with `dtype` queries."""
    level = level or active_level()
    if dtype != io_dtype(level):
        return False
    lib = _library(level)
    lib.rf_prefill_dim_multiple.restype = ctypes.c_int64
    return (kv_heads > 0 and heads % kv_heads == 0
            and heads // kv_heads <= lib.rf_limits.max_group
            and head_dim % lib.rf_prefill_dim_multiple() == 0
            and head_dim <= lib.rf_limits.max_head_dim)


class BatchPrefill:
    """The attention of an extend batch's requests, laid out one after another along the token
    dimension: set up once per forward (slots checked and held), `run` once per layer."""

    def __init__(self, requests: list[tuple[int, int, torch.Tensor]], heads: int, kv_heads: int,
                 head_dim: int, scale: float, level: str | None = None):
        """requests: (new tokens, prefix, KV slots [prefix + new]) each, in token order."""
        self.level = level or active_level()
        self._fn = _kernel(self.level)
        if self._fn is None:
            raise RuntimeError("the prefill attention kernel needs the CPU kernels' avx512 or "
                               "avx2 build")
        self.dtype = io_dtype(self.level)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self._slots, self._jobs, start = [], [], 0
        for new, prefix, slots in requests:
            slots = slots.to(torch.int64).contiguous()
            if slots.dim() != 1 or slots.numel() != prefix + new:
                raise ValueError(f"expected {prefix + new} slots, got {tuple(slots.shape)}")
            self._slots.append(slots)  # the jobs point into them
            self._jobs.append((start, Prefill(
                n=new, prefix=prefix, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                nthreads=torch.get_num_threads(), scale=scale, slots=slots.data_ptr())))
            start += new
        self.num_tokens = start

    def run(self, q: torch.Tensor, k_pool: torch.Tensor | QuantizedRows,
            v_pool: torch.Tensor | QuantizedRows, out: torch.Tensor | None = None
            ) -> torch.Tensor:
        """q [num_tokens, heads, head_dim] in self.dtype (rows may be strided, heads
        contiguous); k_pool / v_pool [num_slots, kv_heads, head_dim] bf16, or an int8 pool's
        codes and scales (kernels/kv_int8.py), with the new tokens' K/V written. Returns (or
        fills `out`, the same shape and dtype, heads contiguous) each token's attention over
        its request's positions 0 .. its own."""
        shape = (self.num_tokens, self.heads, self.head_dim)
        scales = None
        quantized = [isinstance(pool, QuantizedRows) for pool in (k_pool, v_pool)]
        if any(quantized) and not all(quantized):
            raise ValueError("prefill_attention takes a bf16 KV pool (or an int8 one), K and "
                             "V alike")
        if all(quantized):
            scales = (k_pool.scales, v_pool.scales)
            if any(s.dtype != torch.float16 or not s.is_contiguous()
                   or s.shape != k_pool.codes.shape[:2] for s in scales):
                raise ValueError("an int8 pool's scales must be contiguous fp16 [num_slots, "
                                 "kv_heads]")
            k_pool, v_pool = k_pool.codes, v_pool.codes
        pool_dtype = torch.int8 if scales else torch.bfloat16
        if q.dtype != self.dtype or k_pool.dtype != pool_dtype or v_pool.dtype != pool_dtype:
            raise ValueError(f"prefill_attention takes {self.dtype} queries here (the "
                             f"{self.level} build) and a bf16 KV pool (or an int8 one)")
        if q.shape != shape or q.stride(2) != 1 or q.stride(1) != self.head_dim:
            raise ValueError(f"q must be {list(shape)}, its heads contiguous within a row")
        if not (k_pool.is_contiguous() and v_pool.is_contiguous()) \
                or k_pool.shape != v_pool.shape \
                or k_pool.shape[1:] != (self.kv_heads, self.head_dim):
            raise ValueError("k_pool and v_pool must be contiguous [num_slots, kv_heads, "
                             "head_dim]")
        if out is None:
            out = torch.empty(shape, dtype=self.dtype)
        if out.dtype != self.dtype or out.shape != shape or out.stride(2) != 1 \
                or out.stride(1) != self.head_dim:
            raise ValueError("out must be [n, heads, head_dim] of q's dtype, heads contiguous")
        q_rows, out_rows = q.stride(0), out.stride(0)
        q_ptr, out_ptr, size = q.data_ptr(), out.data_ptr(), q.element_size()
        k_ptr, v_ptr = k_pool.data_ptr(), v_pool.data_ptr()
        k_scales, v_scales = (s.data_ptr() for s in scales) if scales else (None, None)
        for start, job in self._jobs:
            job.q_stride, job.out_stride = q_rows, out_rows
            job.q, job.out = q_ptr + start * q_rows * size, out_ptr + start * out_rows * size
            if scales:
                job.k = job.v = None
                job.k_codes, job.v_codes, job.k_scales, job.v_scales = (k_ptr, v_ptr, k_scales,
                                                                        v_scales)
            else:
                job.k, job.v = k_ptr, v_ptr
                job.k_codes = job.v_codes = job.k_scales = job.v_scales = None
            status = self._fn(ctypes.byref(job))
            if status == -1:
                raise ValueError(f"prefill_attention does not take heads={self.heads}, "
                                 f"kv_heads={self.kv_heads}, head_dim={self.head_dim}")
            if status != 0:
                raise MemoryError("prefill_attention could not allocate its work buffers")
        return out


def prefill_attention(q: torch.Tensor, k_pool: torch.Tensor | QuantizedRows,
                      v_pool: torch.Tensor | QuantizedRows,
                      slots: torch.Tensor, prefix: int, scale: float,
                      out: torch.Tensor | None = None,
                      level: str | None = None) -> torch.Tensor:
    """One request's attention: q [n, heads, head_dim] at positions prefix .. prefix + n - 1
    over slots [prefix + n] (BatchPrefill.run's shapes and dtypes). level: the build to run
    (default: the level in force)."""
    n, heads, head_dim = q.shape
    batch = BatchPrefill([(n, prefix, slots)], heads, k_pool.shape[1], head_dim, scale, level)
    return batch.run(q, k_pool, v_pool, out)


def reference(q: torch.Tensor, k_pool: torch.Tensor | QuantizedRows,
              v_pool: torch.Tensor | QuantizedRows, slots: torch.Tensor,
              prefix: int, scale: float | None = None) -> torch.Tensor:
    """prefill_attention in fp32 torch ops (an int8 pool dequantized): [n, heads, head_dim]
    fp32."""
    n, heads, head_dim = q.shape
    scale = 1 / math.sqrt(head_dim) if scale is None else scale
    keys, values = (_gather_int8(pool, slots.long(), torch.float32)
                    if isinstance(pool, QuantizedRows) else pool[slots.long()].float()
                    for pool in (k_pool, v_pool))
    keys, values = keys.transpose(0, 1), values.transpose(0, 1)  # [kv_heads, prefix + n, d]
    visible = torch.arange(prefix + n)[None, :] <= prefix + torch.arange(n)[:, None]
    out = F.scaled_dot_product_attention(q.float().transpose(0, 1), keys, values,
                                         attn_mask=visible, scale=scale,
                                         enable_gqa=heads != k_pool.shape[1])
    return out.transpose(0, 1)
