"""The torch-native backend against a per-request reference: extend with prefixes, decode with
padding, and decode with a shared prefix (cascade), GQA included; each with a sliding window
too (the query at position p sees keys p - window < k <= p)."""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels.cpu import prefill as cpu_prefill
from radixflow.runtime.attention import torch_native
from radixflow.runtime.attention.torch_native import TorchNativeAttnBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

H, KVH, D = 4, 2, 16


def reference(q, k_pool, v_pool, table, rows, prefix_lens, ext_lens, scale, window=None):
    outs, start = [], 0
    for row, p, n in zip(rows, prefix_lens, ext_lens):
        slots = table[row, :p + n].long()
        keys = k_pool[slots].repeat_interleave(H // KVH, dim=1)  # [L, H, D]
        values = v_pool[slots].repeat_interleave(H // KVH, dim=1)
        qs = q[start:start + n]  # [n, H, D]
        scores = torch.einsum("nhd,lhd->hnl", qs.float(), keys.float()) * scale
        k_pos, q_pos = torch.arange(p + n)[None, :], (p + torch.arange(n))[:, None]
        causal = k_pos <= q_pos
        if window is not None:
            causal &= k_pos > q_pos - window
        scores = scores.masked_fill(~causal[None], float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values.float()))
        start += n
    return torch.cat(outs)


def run(mode, prefix_lens, ext_lens, shared_prefix=0, dtype=torch.float32, monkeypatch=None,
        cpu_dtype=None, pool_dtype=None, window=None):
    torch.manual_seed(0)
    bs = len(prefix_lens)
    pool = KVPool(2000, 1, KVH, D, pool_dtype or dtype)
    table = ReqToTokenPool(bs, 512).req_to_token
    shared = pool.alloc(shared_prefix)
    for i, p in enumerate(prefix_lens):
        own = pool.alloc(p - shared_prefix)
        table[i, :p] = torch.cat([shared, own]).int()
    for layer in (pool.k[0], pool.v[0]):
        layer.copy_(torch.randn_like(layer.float()).to(layer.dtype))
    num_tokens = sum(ext_lens)
    out_slots = pool.alloc(num_tokens)
    start = 0
    for i, (p, n) in enumerate(zip(prefix_lens, ext_lens)):
        table[i, p:p + n] = out_slots[start:start + n].int()
        start += n
    q = torch.randn(num_tokens, H, D).to(dtype)
    k = torch.randn(num_tokens, KVH, D).to(dtype)
    v = torch.randn(num_tokens, KVH, D).to(dtype)
    seq = [p + n for p, n in zip(prefix_lens, ext_lens)]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    batch = ForwardBatch(mode, torch.zeros(num_tokens, dtype=torch.int64), torch.zeros(num_tokens,
                         dtype=torch.int64), out_slots, t(list(range(bs))), t(seq), t(prefix_lens),
                         t(ext_lens), seq, list(prefix_lens), list(ext_lens), t([0]), table, pool)
    backend = TorchNativeAttnBackend(H, KVH, D, D ** -0.5, cpu_dtype=cpu_dtype)
    backend.prepare(batch)
    out = backend.forward(q, k, v, 0, batch, window=window)
    ref = reference(q, pool.k[0], pool.v[0], table, range(bs), prefix_lens, ext_lens, D ** -0.5,
                    window)
    return out, ref, batch


@pytest.mark.parametrize("prefix_lens, ext_lens", [
    ([0], [9]), ([5], [4]), ([40], [17]), ([1], [30]),  # (one request: two flash calls)
    ([0, 3, 7], [5, 1, 2]), ([4, 4], [3, 3]), ([10, 0], [1, 6])])
def test_extend(prefix_lens, ext_lens):
    out, ref, _ = run(ForwardMode.EXTEND, prefix_lens, ext_lens)
    torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prefix_lens, ext_lens",
                         [([0], [9]), ([40], [17]), ([0, 3, 7], [5, 1, 2])])
def test_extend_in_the_prefill_kernel(monkeypatch, cpu_level, prefix_lens, ext_lens):
    """Extend batches over a bf16 pool run each request through kernels.cpu.prefill when the
    kernels in force take the model's dtype (bf16 at avx512, fp32 at avx2)."""
    dtype = cpu_prefill.io_dtype()
    if dtype is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    monkeypatch.setitem(cpu_prefill.MIN_PAIRS, cpu_level, 0)  # these are small
    out, ref, batch = run(ForwardMode.EXTEND, prefix_lens, ext_lens, dtype=dtype,
                          cpu_dtype=dtype, pool_dtype=torch.bfloat16)
    assert isinstance(batch.attn_metadata, torch_native._KernelExtendPlan)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_prefill_kernel_only_for_enough_work(cpu_level):
    """At avx2 short prompts stay with torch's attention (as fast there); at avx512 none do."""
    dtype = cpu_prefill.io_dtype()
    if dtype is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    _, _, batch = run(ForwardMode.EXTEND, [3, 0], [4, 9], dtype=dtype, cpu_dtype=dtype,
                      pool_dtype=torch.bfloat16)
    kernel = isinstance(batch.attn_metadata, torch_native._KernelExtendPlan)
    assert kernel == (cpu_level == "avx512")


def test_prefill_kernel_only_over_a_bf16_pool(monkeypatch, cpu_level):
    """Queries the kernels take, but an fp32 KV pool: torch's path."""
    dtype = cpu_prefill.io_dtype()
    if dtype is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    monkeypatch.setitem(cpu_prefill.MIN_PAIRS, cpu_level, 0)
    _, _, batch = run(ForwardMode.EXTEND, [3], [4], dtype=dtype, cpu_dtype=dtype,
                      pool_dtype=torch.float32)
    assert isinstance(batch.attn_metadata, torch_native._ExtendPlan)
    _, _, batch = run(ForwardMode.EXTEND, [3], [4], dtype=dtype, cpu_dtype=dtype,
                      pool_dtype=torch.bfloat16)
    assert isinstance(batch.attn_metadata, torch_native._KernelExtendPlan)


@pytest.mark.parametrize("prefix_lens", [[7], [3, 9, 1], [6, 6, 6]])
def test_decode(prefix_lens):
    out, ref, _ = run(ForwardMode.DECODE, prefix_lens, [1] * len(prefix_lens))
    torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_decode_cascade_over_shared_prefix(monkeypatch, dtype, tol):
    monkeypatch.setattr(torch_native, "CASCADE_MIN_PREFIX", 8)
    out, ref, batch = run(ForwardMode.DECODE, [20, 31, 25], [1, 1, 1], shared_prefix=18,
                          dtype=dtype)
    assert batch.attn_metadata.prefix_slots is not None
    assert batch.attn_metadata.prefix_slots.numel() == 18
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


# windows of 1, shorter than the prefixes, and reaching every key (the forward's own plan);
# one request and several, blocks of WINDOW_BLOCK queries (ext 300), padded ones
@pytest.mark.parametrize("window", [1, 5, 24, 400])
@pytest.mark.parametrize("prefix_lens, ext_lens", [
    ([0], [30]), ([40], [17]), ([3], [300]), ([0, 3, 37], [5, 1, 29]), ([4, 4], [3, 3])])
def test_extend_window(window, prefix_lens, ext_lens):
    out, ref, batch = run(ForwardMode.EXTEND, prefix_lens, ext_lens, window=window)
    torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)
    binds = max(p + n for p, n in zip(prefix_lens, ext_lens)) > window
    assert (batch.attn_metadata.windowed[window] is not None) == binds


def test_extend_window_leaves_the_prefill_kernel(monkeypatch, cpu_level):
    """A windowed layer of a batch the CPU prefill kernel takes runs torch's attention through
    the window (the kernel attends over the whole prefix); a window that sees every key keeps
    the kernel."""
    dtype = cpu_prefill.io_dtype()
    if dtype is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    monkeypatch.setitem(cpu_prefill.MIN_PAIRS, cpu_level, 0)
    for window, kernel in ((6, False), (64, True)):
        out, ref, batch = run(ForwardMode.EXTEND, [0, 20], [17, 9], dtype=dtype,
                              cpu_dtype=dtype, pool_dtype=torch.bfloat16, window=window)
        assert isinstance(batch.attn_metadata, torch_native._KernelExtendPlan)
        windowed = batch.attn_metadata.windowed[window]
        assert (windowed is None) == kernel
        torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("window", [1, 4, 8, 30])
@pytest.mark.parametrize("prefix_lens", [[7], [3, 9, 1], [6, 6, 6]])
def test_decode_window(window, prefix_lens):
    out, ref, _ = run(ForwardMode.DECODE, prefix_lens, [1] * len(prefix_lens), window=window)
    torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)


def test_decode_window_skips_the_cascade(monkeypatch):
    """A shared prefix the forward's plan attends once for all (cascade): a windowed layer
    attends each request's own last keys instead."""
    monkeypatch.setattr(torch_native, "CASCADE_MIN_PREFIX", 8)
    for window in (3, 19, 40):
        out, ref, batch = run(ForwardMode.DECODE, [20, 31, 25], [1, 1, 1], shared_prefix=18,
                              window=window)
        assert batch.attn_metadata.prefix_slots is not None
        windowed = batch.attn_metadata.windowed[window]
        assert windowed is None if window >= 32 else windowed.prefix_slots is None
        torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)
