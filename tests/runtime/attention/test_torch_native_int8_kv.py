"""The int8 KV pool (--kv-cache-dtype int8) and the torch-native backend over it: the pool's
quantization against kernels/kv_int8.py's definition; every attention plan (extend with a
prefix, padded decode, the cascade over a shared prefix, a sliding window, one request's run of
consecutive slots, the CPU prefill kernel at each level) against an fp32 reference over the
dequantized pool with its key offset added back (tight: only the path's own rounding; the
offset shifts every score of a query alike), and against the same batch over a bf16 pool
(loose: int8's error)."""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels import kv_int8
from radixflow.kernels.cpu import prefill as cpu_prefill
from radixflow.runtime.attention import torch_native
from radixflow.runtime.attention.torch_native import TorchNativeAttnBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

H, KVH, D = 4, 2, 16


def test_keys_are_stored_rotated_and_rotation_is_its_own_inverse():
    x = torch.randn(5, KVH, D)
    h = kv_int8.rotate(torch.eye(D))
    torch.testing.assert_close(h, h.T)
    torch.testing.assert_close(kv_int8.rotate(kv_int8.rotate(x)), x, atol=1e-6, rtol=0)
    q = torch.randn(D)
    torch.testing.assert_close(kv_int8.rotate(q) @ kv_int8.rotate(x).transpose(-1, -2),
                               q @ x.transpose(-1, -2), atol=1e-5, rtol=1e-5)
    t = torch.ones(3, 48)
    assert kv_int8.rotate(t) is t and not kv_int8.is_rotated(48)  # no H of order 48
    pool = KVPool(4, 1, KVH, D, torch.int8)
    slots = pool.alloc(2)
    pool.write(0, slots, x[:2], x[:2])
    kr, vr = pool.layer(0)
    rotated, plain = (kv_int8.gather(r, slots, torch.float32) for r in (kr, vr))
    torch.testing.assert_close(rotated, kv_int8.rotate(x[:2]), atol=0.03, rtol=0)
    torch.testing.assert_close(plain, x[:2], atol=0.03, rtol=0)


def test_key_offset_is_near_the_mean_and_puts_the_first_key_on_the_grid():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(60, KVH, D, generator=g) + 5 * torch.randn(1, KVH, D, generator=g)
    keys[0] *= 3  # the sink: far from the others
    offset = kv_int8.key_offset(keys)
    assert offset.shape == (KVH, D) and offset.dtype == torch.float32
    first = keys[0] - offset
    torch.testing.assert_close(kv_int8.dequantize(*kv_int8.quantize(first), torch.float32),
                               first, atol=1e-5, rtol=0)
    mean = keys[1:].mean(0)
    half_step = (keys[0] - mean).abs().amax(-1, keepdim=True) / 254
    assert bool(((offset - mean).abs() <= half_step * 1.01).all())
    # centred, the others' error falls: their common part no longer sets their scale
    err = {name: (kv_int8.dequantize(*kv_int8.quantize(keys[1:] - c), torch.float32)
                  - (keys[1:] - c)).abs().mean()
           for name, c in (("plain", 0), ("centred", offset))}
    assert err["centred"] < 0.5 * err["plain"]


def test_pool_stores_keys_less_its_offset_and_logs_them_when_asked():
    pool = KVPool(8, 2, KVH, D, torch.int8)
    assert all(bool((o == 0).all()) for o in pool.k_offsets)
    pool.k_offsets[1].copy_(torch.randn(KVH, D))
    slots = pool.alloc(3)
    k, v = torch.randn(3, KVH, D), torch.randn(3, KVH, D)
    log = pool.record_keys()
    pool.write(1, slots, k, v)
    pool.stop_recording()
    pool.write(1, slots, k, v)  # not logged
    assert list(log) == [1] and len(log[1]) == 1
    torch.testing.assert_close(log[1][0], kv_int8.rotate(k))
    stored = kv_int8.gather(pool.layer(1)[0], slots, torch.float32)
    torch.testing.assert_close(stored + pool.k_offsets[1], kv_int8.rotate(k), atol=0.03, rtol=0)
    as_stored_k, as_stored_v = pool.as_stored(1, k, v, torch.float32)
    torch.testing.assert_close(as_stored_k, stored, atol=1e-6, rtol=0)
    torch.testing.assert_close(as_stored_v, kv_int8.gather(pool.layer(1)[1], slots,
                                                           torch.float32), atol=1e-6, rtol=0)


def test_quantize_round_trip_and_zero_rows():
    x = torch.randn(50, KVH, D) * torch.logspace(-3, 2, 50)[:, None, None]
    x[3] = 0
    codes, scales = kv_int8.quantize(x)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16
    assert scales.shape == (50, KVH) and int(codes.abs().max()) == 127
    back = kv_int8.dequantize(codes, scales, torch.float32)
    assert torch.equal(back[3], torch.zeros(KVH, D))
    # each element within half a step of its scale (plus fp16's rounding of the scale)
    err = (back - x).abs() / scales.float()[..., None].clamp(min=1e-30)
    assert float(err.max()) <= 0.5 + 1e-2


def test_pool_writes_codes_and_scales_and_counts_their_bytes():
    pool = KVPool(8, 2, KVH, D, torch.int8)
    assert pool.is_int8 and pool.k[1].dtype == torch.int8
    assert pool.k_scales[1].shape == (9, KVH) and pool.k_scales[1].dtype == torch.float16
    slots = pool.alloc(3)
    k, v = torch.randn(3, KVH, D), torch.randn(3, KVH, D)
    pool.write(1, slots, k, v)
    kr, vr = pool.layer(1)
    assert isinstance(kr, kv_int8.QuantizedRows)
    keys = kv_int8.rotate(kv_int8.gather(kr, slots, torch.float32))  # (H H = I)
    torch.testing.assert_close(keys, k, atol=0.03, rtol=0)
    torch.testing.assert_close(kv_int8.gather(vr, slots, torch.float32), v, atol=0.03, rtol=0)
    assert int(pool.k[0].abs().sum()) == 0  # other layers untouched
    bf16 = KVPool.bytes_per_token(30, 3, 64, torch.bfloat16)
    int8 = KVPool.bytes_per_token(30, 3, 64, torch.int8)
    assert int8 == 2 * 30 * 3 * (64 + 2) and bf16 / int8 == pytest.approx(1.94, abs=0.01)


def reference(q, keys_of, values_of, table, prefix_lens, ext_lens, scale, window=None):
    """fp32 attention of each request's queries over keys_of(slots) / values_of(slots)."""
    outs, start = [], 0
    for row, (p, n) in enumerate(zip(prefix_lens, ext_lens)):
        slots = table[row, :p + n].long()
        keys = keys_of(slots).repeat_interleave(H // KVH, dim=1)  # [L, H, D]
        values = values_of(slots).repeat_interleave(H // KVH, dim=1)
        scores = torch.einsum("nhd,lhd->hnl", q[start:start + n].float(), keys) * scale
        k_pos, q_pos = torch.arange(p + n)[None, :], (p + torch.arange(n))[:, None]
        visible = k_pos <= q_pos
        if window is not None:
            visible &= k_pos > q_pos - window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        outs.append(torch.einsum("hnl,lhd->nhd", scores.softmax(-1), values))
        start += n
    return torch.cat(outs)


def run(mode, prefix_lens, ext_lens, pool_dtype, *, shared_prefix=0, dtype=torch.float32,
        cpu_dtype=None, window=None):
    """The batch over a pool of pool_dtype (prefix K/V written through the pool, as a forward
    would): (output, fp32 reference over what the pool holds, batch)."""
    g = torch.Generator().manual_seed(0)
    bs = len(prefix_lens)
    pool = KVPool(600, 1, KVH, D, pool_dtype)
    if pool.is_int8:  # keys stored centred (as a calibrated pool's): attention unchanged
        pool.k_offsets[0].copy_(torch.randn(KVH, D, generator=torch.Generator().manual_seed(7)))
    table = ReqToTokenPool(bs, 512).req_to_token
    shared = pool.alloc(shared_prefix)
    for i, p in enumerate(prefix_lens):
        table[i, :p] = torch.cat([shared, pool.alloc(p - shared_prefix)]).int()
    written = pool.num_slots - pool.num_free
    cached = torch.arange(1, written + 1)
    pool.write(0, cached, torch.randn(written, KVH, D, generator=g) * 2,
               torch.randn(written, KVH, D, generator=g))
    num_tokens = sum(ext_lens)
    out_slots = pool.alloc(num_tokens)
    start = 0
    for i, (p, n) in enumerate(zip(prefix_lens, ext_lens)):
        table[i, p:p + n] = out_slots[start:start + n].int()
        start += n
    q = torch.randn(num_tokens, H, D, generator=g).to(dtype)
    k = (torch.randn(num_tokens, KVH, D, generator=g) * 2).to(dtype)
    v = torch.randn(num_tokens, KVH, D, generator=g).to(dtype)
    seq = [p + n for p, n in zip(prefix_lens, ext_lens)]
    t = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    batch = ForwardBatch(mode, torch.zeros(num_tokens, dtype=torch.int64),
                         torch.zeros(num_tokens, dtype=torch.int64), out_slots, t(list(range(bs))),
                         t(seq), t(prefix_lens), t(ext_lens), seq, list(prefix_lens),
                         list(ext_lens), t([0]), table, pool)
    backend = TorchNativeAttnBackend(H, KVH, D, D ** -0.5, cpu_dtype=cpu_dtype)
    backend.prepare(batch)
    out = backend.forward(q, k, v, 0, batch, window=window)
    k_rows, v_rows = pool.layer(0)
    if pool.is_int8:
        # the stored keys are rotated (kv_int8.rotate) less the offset: with it added back and
        # rotated again, they are the keys
        keys_of = lambda s: kv_int8.rotate(  # noqa: E731
            kv_int8.gather(k_rows, s, torch.float32) + pool.k_offsets[0])
        values_of = lambda s: kv_int8.gather(v_rows, s, torch.float32)  # noqa: E731
    else:
        keys_of, values_of = (lambda s: k_rows[s].float()), (lambda s: v_rows[s].float())
    ref = reference(q, keys_of, values_of, table, prefix_lens, ext_lens, D ** -0.5, window)
    return out, ref, batch


CASES = [
    (ForwardMode.EXTEND, [0], [9], {}), (ForwardMode.EXTEND, [40], [17], {}),
    (ForwardMode.EXTEND, [0, 3, 7], [5, 1, 2], {}),
    (ForwardMode.DECODE, [7], [1], {}),  # one request: a run of consecutive slots, no gather
    (ForwardMode.DECODE, [3, 9, 1], [1, 1, 1], {}),  # padded
    (ForwardMode.DECODE, [20, 31, 25], [1, 1, 1], {"shared_prefix": 18}),  # cascade
    (ForwardMode.DECODE, [20, 31, 25], [1, 1, 1], {"window": 5}),
    (ForwardMode.EXTEND, [0, 3, 37], [5, 1, 29], {"window": 6}),
]


@pytest.mark.parametrize("mode, prefix_lens, ext_lens, extra", CASES)
def test_int8_pool_matches_its_dequantized_reference(monkeypatch, mode, prefix_lens, ext_lens,
                                                     extra):
    monkeypatch.setattr(torch_native, "CASCADE_MIN_PREFIX", 8)
    out, ref, batch = run(mode, prefix_lens, ext_lens, torch.int8, **extra)
    if extra.get("shared_prefix"):
        assert batch.attn_metadata.prefix_slots is not None
    torch.testing.assert_close(out.float(), ref, atol=1e-4, rtol=1e-4)
    out_bf16, _, _ = run(mode, prefix_lens, ext_lens, torch.bfloat16, **extra)
    torch.testing.assert_close(out.float(), out_bf16.float(), atol=0.06, rtol=0.06)


@pytest.mark.parametrize("prefix_lens, ext_lens", [([0], [9]), ([40], [17]),
                                                   ([0, 3, 7], [5, 1, 2])])
def test_int8_pool_in_the_prefill_kernel(monkeypatch, cpu_level, prefix_lens, ext_lens):
    """Extend batches over an int8 pool run kernels.cpu.prefill (it reads the codes and scales
    in place) where the level's kernels take the model's dtype."""
    dtype = cpu_prefill.io_dtype()
    if dtype is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    monkeypatch.setitem(cpu_prefill.MIN_PAIRS, cpu_level, 0)
    out, ref, batch = run(ForwardMode.EXTEND, prefix_lens, ext_lens, torch.int8, dtype=dtype,
                          cpu_dtype=dtype)
    assert isinstance(batch.attn_metadata, torch_native._KernelExtendPlan)
    tol = 3e-2 if dtype == torch.bfloat16 else 2e-3  # bf16 q, weights and output at avx512
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
