"""Triton extend / decode attention over an int8 KV cache (kv_int8.QuantizedRows: codes and
fp16 scales, dequantized tile by tile in the kernels) on the GPU, or the CPU under the
interpreter (`kernel_device`): against the torch references over the same cache (which
dequantize to fp32), split-KV, the shared-prefix cascade and a sliding window included; and
the Triton backend over an int8 KVPool against torch_native over one. Tolerances: the float
tests' (tests/helpers/paged_attention.py's TOL) for q's dtype.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from helpers.paged_attention import TOL, make_paged, make_shared

from radixflow.kernels import kv_int8
from radixflow.kernels.attention import decode_attention, extend_attention


def quantized(case: dict) -> dict:
    """The case with its caches as int8 (the new tokens' K/V as the cache holds them)."""
    out = dict(case)
    for name in ("k_cache", "v_cache"):
        out[name] = kv_int8.QuantizedRows(*kv_int8.quantize(case[name]))
    for name in ("k", "v"):
        out[name] = kv_int8.dequantize(*kv_int8.quantize(case[name]), case["q"].dtype)
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,dtype,window", [
    (4, 2, 64, torch.float32, None), (8, 1, 32, torch.bfloat16, None),
    (4, 4, 16, torch.float32, 5)])
def test_extend_over_int8_cache(num_heads, num_kv_heads, head_dim, dtype, window,
                                kernel_device):
    case = quantized(make_paged([0, 7, 40], [5, 9, 33], num_heads, num_kv_heads, head_dim,
                                dtype, seed=1, device=kernel_device))
    keys = ("q", "k", "v", "k_cache", "v_cache", "req_to_token", "req_pool_indices",
            "prefix_lens", "extend_lens", "extend_starts")
    args = [case[k] for k in keys]
    scale = 1 / math.sqrt(head_dim)
    want = extend_attention(*args, scale=scale, window=window, backend="torch")
    got = extend_attention(*args, scale=scale, window=window, backend="triton")
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,dtype,splits,window", [
    (4, 4, 64, torch.float32, 3, None), (8, 2, 64, torch.bfloat16, 1, None),
    (4, 2, 32, torch.float32, 2, 7)])
def test_decode_over_int8_cache(num_heads, num_kv_heads, head_dim, dtype, splits, window,
                                kernel_device):
    seq_lens = [1, 2, 31, 64, 97]
    case = quantized(make_paged([s - 1 for s in seq_lens], [1] * len(seq_lens), num_heads,
                                num_kv_heads, head_dim, dtype, seed=2, device=kernel_device))
    args = (case["q"], case["k_cache"], case["v_cache"], case["req_to_token"],
            case["req_pool_indices"], case["seq_lens"])
    scale = 1 / math.sqrt(head_dim)
    want = decode_attention(*args, scale=scale, window=window, backend="torch")
    got = decode_attention(*args, scale=scale, num_kv_splits=splits, window=window,
                           backend="triton")
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def test_decode_over_shared_prefixes_of_an_int8_cache(kernel_device):
    q, k_cache, v_cache, *rest = make_shared(
        [(70, [3, 1, 40]), (0, [5]), (66, [2, 0])], num_heads=8, num_kv_heads=2, head_dim=32,
        dtype=torch.float32, device=kernel_device)
    k_cache, v_cache = (kv_int8.QuantizedRows(*kv_int8.quantize(c)) for c in (k_cache, v_cache))
    args = (q, k_cache, v_cache, *rest)
    want = decode_attention(*args, scale=0.2, backend="torch")
    got = decode_attention(*args, scale=0.2, num_kv_splits=2, backend="triton")
    torch.testing.assert_close(got, want, **TOL[torch.float32])


def test_triton_backend_over_an_int8_pool_matches_torch_native(kernel_device):
    from radixflow.runtime.attention.torch_native import TorchNativeAttnBackend
    from radixflow.runtime.attention.triton_backend import TritonAttnBackend
    from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
    from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

    heads, kv_heads, dim = 4, 2, 32
    g = torch.Generator().manual_seed(0)
    outs = []
    for backend, device in ((TorchNativeAttnBackend(heads, kv_heads, dim, 0.2), "cpu"),
                            (TritonAttnBackend(heads, kv_heads, dim, 0.2,
                                               dtype=torch.float32), kernel_device)):
        pool = KVPool(100, 1, kv_heads, dim, torch.int8, device)
        # keys stored centred (a calibrated pool's): the new tokens' too (KVPool.as_stored)
        pool.k_offsets[0].copy_(torch.randn(kv_heads, dim,
                                            generator=torch.Generator().manual_seed(3)))
        table = ReqToTokenPool(2, 64, device).req_to_token
        got = []
        for mode, prefix, new in ((ForwardMode.EXTEND, [0, 0], [9, 5]),
                                  (ForwardMode.DECODE, [9, 5], [1, 1])):
            slots = pool.alloc(sum(new))
            at = 0
            for row, (p, n) in enumerate(zip(prefix, new)):
                table[row, p:p + n] = slots[at:at + n].int()
                at += n
            g.manual_seed(len(got))
            q, k, v = (torch.randn(sum(new), h, dim, generator=g).to(device)
                       for h in (heads, kv_heads, kv_heads))
            seq = [p + n for p, n in zip(prefix, new)]
            t = functools.partial(torch.tensor, dtype=torch.int64, device=device)
            batch = ForwardBatch(mode, t([0] * sum(new)), t([0] * sum(new)), slots, t([0, 1]),
                                 t(seq), t(prefix), t(new), seq, prefix, new, t([0]), table,
                                 pool)
            backend.prepare(batch)
            got.append(backend.forward(q, k, v, 0, batch).cpu())
        outs.append(got)
    for cpu_out, kernel_out in zip(*outs):
        torch.testing.assert_close(kernel_out, cpu_out, atol=1e-4, rtol=1e-4)
