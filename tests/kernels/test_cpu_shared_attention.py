"""The C decode step's attention over a prefix that several requests share (rf_attend_shared:
all their queries against each block of prefix keys as one matrix product) against the same
keys attended per request (rf_attend_part) and an fp32 reference, at every CPU level this
machine runs (the `cpu_level` fixture); and how the step finds the requests that share one.

Tolerances as the per-request path's: the shared product may be at most a little further from
fp32 than it (bf16 queries and weights at avx512, fp32 arithmetic at avx2).
"""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels import cpu
from radixflow.kernels.cpu.decode import DecodeStep, LayerWeights, ModelShape


def make_step(heads: int, kv_heads: int, head_dim: int, slots: int = 600, *,
              max_batch: int = 64, seed: int = 0) -> DecodeStep:
    """A one-layer step over a random bf16 KV pool (its products are never run here)."""
    g = torch.Generator().manual_seed(seed)
    hidden = 32

    def weight(n: int, k: int) -> cpu.TiledWeight:
        return cpu.tile_bf16(torch.randn(n, k, generator=g))

    k = torch.randn(slots, kv_heads, head_dim, generator=g).bfloat16()
    v = torch.randn(slots, kv_heads, head_dim, generator=g).bfloat16()
    q_out = (heads + 2 * kv_heads) * head_dim
    layer = LayerWeights(torch.ones(hidden), torch.ones(hidden), None, None, None,
                         weight(q_out, hidden), weight(hidden, heads * head_dim),
                         weight(64, hidden), weight(hidden, 32), k, v)
    shape = ModelShape(hidden, heads, kv_heads, head_dim, 32, 32, 1e-5, head_dim ** -0.5)
    return DecodeStep(shape, [layer], torch.ones(hidden), weight(32, hidden), 1024, 1,
                      max_batch=max_batch)


def reference(step: DecodeStep, q: torch.Tensor, slots: torch.Tensor, bf16_q: bool):
    """fp32 attention of each request's queries over the slots (queries rounded to bf16 where
    the level multiplies bf16 ones)."""
    layer = step._keep[0][0]
    group = step.shape.heads // step.shape.kv_heads
    keys = layer.k_cache[slots.long()].float().repeat_interleave(group, 1)
    values = layer.v_cache[slots.long()].float().repeat_interleave(group, 1)
    q = q.bfloat16().float() if bf16_q else q
    probs = torch.softmax(torch.einsum("nhd,khd->nhk", q, keys) * step.shape.scale, -1)
    return torch.einsum("nhk,khd->nhd", probs, values)


@pytest.mark.parametrize("heads,kv_heads,head_dim,requests,keys", [
    (9, 3, 64, 16, 200),  # the default model's heads; blocks of 64 keys and a rest
    (4, 2, 16, 3, 7),  # fewer keys than a block, an odd count (a key pairs with a 0 weight)
    (12, 1, 16, 5, 65),  # 60 queries for one KV head: 4 registers of 16, one part-filled
    (6, 3, 48, 64, 64),  # the largest batch (192 queries per KV head); a half 32-value chunk
    (2, 1, 96, 2, 129),  # 3 chunks of 32 values
    (2, 2, 256, 3, 33),  # the widest head the tests use
    (4, 4, 32, 1, 1),  # one request, one key
])
def test_shared_prefix_product_matches_per_request_attention(cpu_level, heads, kv_heads,
                                                             head_dim, requests, keys):
    step = make_step(heads, kv_heads, head_dim)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(requests, heads, head_dim, generator=g)
    slots = (torch.randperm(600, generator=g)[:keys]).int()  # scattered, as after reuse
    together = step.attend(0, q, slots, together=True)
    alone = step.attend(0, q, slots, together=False)
    exact = reference(step, q, slots, bf16_q=cpu_level == "avx512")
    err, err_alone = (together - exact).abs().max(), (alone - exact).abs().max()
    assert err <= err_alone * 1.5 + 1e-6, (err, err_alone)
    tol = 2e-2 if cpu_level == "avx512" else 1e-4  # tests/kernels/test_attention.py's
    torch.testing.assert_close(together, exact, atol=tol, rtol=tol)


def rows_table(parts: list[list[torch.Tensor]], width: int = 400):
    """A request -> slot table whose rows are the concatenated parts (rows 0..n-1)."""
    table = torch.zeros(len(parts) + 2, width, dtype=torch.int32)
    lens = []
    for row, pieces in enumerate(parts):
        slots = torch.cat(pieces)
        table[row, :len(slots)] = slots
        lens.append(len(slots))
    return table, torch.arange(len(parts)), torch.tensor(lens)


def test_requests_are_grouped_by_the_slots_their_rows_begin_with(cpu_level):
    step = make_step(4, 2, 16)
    slots = iter(torch.arange(1, 10_000, dtype=torch.int32).split(1))

    def fresh(n: int) -> torch.Tensor:
        return torch.cat([next(slots) for _ in range(n)])

    a, b = fresh(200), fresh(90)
    table, rows, lens = rows_table([
        [a, fresh(5)], [b, fresh(31)], [a, fresh(1)],  # two groups, not adjacent
        [b[:40], fresh(9)],  # 40 of b's slots: fewer than 64, alone
        [a[:10], fresh(100)],  # 10 of a's: alone
        [a[:150], fresh(3)],  # joins a's group (3 x 150 keys read once beats 2 x 200)
        [fresh(120)],  # shares nothing
        [b, fresh(7)],
    ])
    assert step.min_shared_prefix == 64
    assert step.shared_prefixes(table, rows, lens) == [150, 90, 150, 0, 0, 150, 0, 90]
    step.min_shared_prefix = 16  # now row 3 joins b's group (first come), which keeps 40
    assert step.shared_prefixes(table, rows, lens) == [150, 40, 150, 40, 0, 150, 0, 40]
    step.min_shared_prefix = 0  # off
    assert step.shared_prefixes(table, rows, lens) == [0] * 8
    with pytest.raises(ValueError):
        step.min_shared_prefix = -1
    # a row that would cut a long shared prefix short leads a group of its own instead
    step.min_shared_prefix = 64
    table, rows, lens = rows_table([[a, fresh(2)], [a, fresh(2)], [a, fresh(2)],
                                    [a[:70], fresh(2)]])
    assert step.shared_prefixes(table, rows, lens) == [200, 200, 200, 0]
