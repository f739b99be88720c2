"""The C kernels over an int8 KV cache (--kv-cache-dtype int8: kernels/kv_int8.py's codes and
fp16 scales, read in place, each block of keys dequantized into scratch as it is read) at every
CPU level this machine runs (the `cpu_level` fixture): the decode step's attention per request
(rf_attend_part) and over a shared prefix (rf_attend_shared), and the prefill kernel, each
against an fp32 reference over the dequantized cache (tight: the level's own rounding, as its
bf16 tests allow: at avx512 the dequantized values rounded to bf16, at avx2 fp32 throughout,
the codes exact and the scales folded into the scores and weights) and against the same
kernel over a bf16 cache of the unquantized values (loose: int8's error); and the step's own
K/V writes, quantized as kv_int8.quantize does.
"""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels import cpu, kv_int8
from radixflow.kernels.cpu import prefill
from radixflow.kernels.cpu.decode import DecodeStep, LayerWeights, ModelShape


def make_step(heads: int, kv_heads: int, head_dim: int, kv: str, slots: int = 600,
              seed: int = 0) -> tuple[DecodeStep, torch.Tensor, torch.Tensor]:
    """A one-layer step over a random KV cache of `kv` ("int8" or "bf16": the same values),
    and those values (fp32)."""
    g = torch.Generator().manual_seed(seed)
    hidden = 32

    def weight(n: int, k: int) -> cpu.TiledWeight:
        return cpu.tile_bf16(torch.randn(n, k, generator=g))

    k = torch.randn(slots, kv_heads, head_dim, generator=g) * 2
    v = torch.randn(slots, kv_heads, head_dim, generator=g)
    q_out = (heads + 2 * kv_heads) * head_dim
    if kv == "int8":
        (kc, ks), (vc, vs) = kv_int8.quantize(k), kv_int8.quantize(v)
        cache = dict(k_cache=kc, v_cache=vc, k_scales=ks, v_scales=vs)
    else:
        cache = dict(k_cache=k.bfloat16(), v_cache=v.bfloat16())
    layer = LayerWeights(torch.ones(hidden), torch.ones(hidden), None, None, None,
                         weight(q_out, hidden), weight(hidden, heads * head_dim),
                         weight(64, hidden), weight(hidden, 32), **cache)
    shape = ModelShape(hidden, heads, kv_heads, head_dim, 32, 32, 1e-5, head_dim ** -0.5)
    step = DecodeStep(shape, [layer], torch.ones(hidden), weight(32, hidden), 1024, 1,
                      max_batch=64)
    return step, k, v


def dequantized(step: DecodeStep) -> tuple[torch.Tensor, torch.Tensor]:
    layer = step._keep[0][0]
    return (kv_int8.dequantize(layer.k_cache, layer.k_scales, torch.float32),
            kv_int8.dequantize(layer.v_cache, layer.v_scales, torch.float32))


def reference(step: DecodeStep, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor,
              slots: torch.Tensor, bf16: bool) -> torch.Tensor:
    """fp32 attention of each request's queries over k, v at the slots (queries and K/V rounded
    to bf16 where the level multiplies bf16 ones)."""
    group = step.shape.heads // step.shape.kv_heads
    keys, values = (x[slots.long()].repeat_interleave(group, 1) for x in (k, v))
    if bf16:
        q, keys, values = q.bfloat16().float(), keys.bfloat16().float(), values.bfloat16().float()
    probs = torch.softmax(torch.einsum("nhd,khd->nhk", q, keys) * step.shape.scale, -1)
    return torch.einsum("nhk,khd->nhd", probs, values)


@pytest.mark.parametrize("heads,kv_heads,head_dim,requests,keys", [
    (9, 3, 64, 4, 200),  # the default model's heads; blocks of 16 and 64 keys and a rest
    (4, 2, 16, 3, 7),  # fewer keys than a block, an odd count
    (6, 3, 48, 2, 65),  # a half 32-value chunk
    (2, 2, 256, 2, 33),  # a wide head
    (4, 4, 32, 1, 1),  # one key
])
@pytest.mark.parametrize("together", [False, True])
def test_decode_attention_over_an_int8_cache(cpu_level, heads, kv_heads, head_dim, requests,
                                             keys, together):
    if cpu_level == "avx2" and head_dim % 16:
        pytest.skip("avx2's attention takes head_dim in multiples of 16")
    step, k, v = make_step(heads, kv_heads, head_dim, "int8")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(requests, heads, head_dim, generator=g)
    slots = torch.randperm(600, generator=g)[:keys].int()  # scattered, as after reuse
    out = step.attend(0, q, slots, together=together)
    exact = reference(step, *dequantized(step), q, slots, bf16=cpu_level == "avx512")
    tol = 2e-2 if cpu_level == "avx512" else 1e-4  # avx2: exact codes, scales folded in
    torch.testing.assert_close(out, exact, atol=tol, rtol=tol)
    bf16_step, _, _ = make_step(heads, kv_heads, head_dim, "bf16")
    torch.testing.assert_close(out, bf16_step.attend(0, q, slots, together=together),
                               atol=0.08, rtol=0.08)


@pytest.mark.parametrize("n, prefix, heads, kv_heads, head_dim", [
    (100, 0, 9, 3, 64), (37, 70, 9, 3, 64), (5, 0, 4, 2, 16), (130, 3, 2, 1, 32),
    (20, 10, 4, 4, 128)])
def test_prefill_attention_over_an_int8_cache(cpu_level, n, prefix, heads, kv_heads, head_dim):
    if prefill.io_dtype() is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    g = torch.Generator().manual_seed(0)
    pool = prefix + n + 5
    k = torch.randn(pool, kv_heads, head_dim, generator=g) * 2
    v = torch.randn(pool, kv_heads, head_dim, generator=g)
    rows = [kv_int8.QuantizedRows(*kv_int8.quantize(x)) for x in (k, v)]
    slots = torch.randperm(pool, generator=g)[:prefix + n]
    q = torch.randn(n, heads, head_dim, generator=g).bfloat16().to(prefill.io_dtype())
    scale = head_dim ** -0.5
    out = prefill.prefill_attention(q, *rows, slots, prefix, scale)
    exact = prefill.reference(q, *rows, slots, prefix, scale)
    tol = 2e-2 if cpu_level == "avx512" else 1e-4  # avx2 widens the codes to fp32 exactly
    torch.testing.assert_close(out.float(), exact, atol=tol, rtol=tol)
    bf16 = prefill.prefill_attention(q, k.bfloat16(), v.bfloat16(), slots, prefix, scale)
    torch.testing.assert_close(out.float(), bf16.float(), atol=0.08, rtol=0.08)


def test_prefill_refuses_a_half_int8_pool(cpu_level):
    if prefill.io_dtype() is None:
        pytest.skip(f"no CPU kernels at {cpu_level} here")
    k = kv_int8.QuantizedRows(*kv_int8.quantize(torch.randn(8, 1, 16)))
    q = torch.randn(2, 1, 16).to(prefill.io_dtype())
    with pytest.raises(ValueError, match="K and V alike"):
        prefill.prefill_attention(q, k, torch.zeros(8, 1, 16, dtype=torch.int8),
                                  torch.arange(2), 0, 0.25)


def test_decode_step_refuses_a_cache_it_cannot_read():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="bf16 or int8"):  # an fp32 cache
        layer = LayerWeights(torch.ones(32), torch.ones(32), None, None, None,
                             cpu.tile_bf16(torch.randn(128, 32, generator=g)),
                             cpu.tile_bf16(torch.randn(32, 64, generator=g)),
                             cpu.tile_bf16(torch.randn(64, 32, generator=g)),
                             cpu.tile_bf16(torch.randn(32, 32, generator=g)),
                             torch.zeros(8, 2, 16), torch.zeros(8, 2, 16))
        DecodeStep(ModelShape(32, 4, 2, 16, 32, 32, 1e-5, 0.25), [layer], torch.ones(32),
                   cpu.tile_bf16(torch.randn(32, 32, generator=g)), 64, 1)
