"""TritonAttnBackend (on the GPU, or the CPU under the interpreter) against
TorchNativeAttnBackend (on the CPU) on the same ForwardBatch: a mixed extend batch (empty and
cached prefixes, varied lengths), then a decode batch over what the extend wrote. Tolerance:
fp32 atol 1e-4 / rtol 1e-4."""

from __future__ import annotations

import pytest
import torch

from radixflow.runtime.attention.torch_native import TorchNativeAttnBackend
from radixflow.runtime.attention.triton_backend import TritonAttnBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 64
TOL = {"atol": 1e-4, "rtol": 1e-4}


class Pools:
    """A KV pool and token table per backend: torch_native's on the CPU, triton's on the
    kernel device (the same ones when that is the CPU). Both see the same slots and writes."""

    def __init__(self, device: torch.device, num_slots=400, num_layers=2, rows=8, width=128):
        def make(on):
            return (KVPool(num_slots, num_layers, NUM_KV_HEADS, HEAD_DIM, torch.float32, on),
                    ReqToTokenPool(rows, width, on))

        self.cpu = make("cpu")
        self.kernel = self.cpu if device.type == "cpu" else make(device)

    def each(self):
        return [self.cpu] if self.kernel is self.cpu else [self.cpu, self.kernel]

    def copy_rows(self, dst, src):
        for _, table in self.each():
            table.req_to_token[dst] = table.req_to_token[src].clone()


def make_batch(mode, pools, rows, prefix_lens, extend_lens):
    """(torch_native's batch, triton's batch) over the two pools, alike."""
    batches = [_batch_over(mode, each, rows, prefix_lens, extend_lens) for each in pools.each()]
    return batches[0], batches[-1]


def _batch_over(mode, pools, rows, prefix_lens, extend_lens):
    kv_pool, req_to_token_pool = pools
    out_slots = kv_pool.alloc(sum(extend_lens))
    used = 0
    for row, prefix_len, extend_len in zip(rows, prefix_lens, extend_lens, strict=True):
        req_to_token_pool.req_to_token[row, prefix_len:prefix_len + extend_len] = \
            out_slots[used:used + extend_len].int()
        used += extend_len
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    positions = [p + i for p, e in zip(prefix_lens, extend_lens, strict=True) for i in range(e)]

    def t(values):
        return torch.tensor(values, dtype=torch.int64, device=kv_pool.device)

    return ForwardBatch(
        mode=mode, input_ids=t([0] * len(positions)),
        positions=t(positions), out_slots=out_slots, req_pool_indices=t(rows),
        seq_lens=t(seq_lens), prefix_lens=t(prefix_lens), extend_lens=t(extend_lens),
        seq_lens_cpu=seq_lens, prefix_lens_cpu=list(prefix_lens),
        extend_lens_cpu=list(extend_lens),
        logits_indices=t([len(positions) - 1]), req_to_token=req_to_token_pool.req_to_token,
        kv_pool=kv_pool,
    )


def run_both(batches, layer_id, g, window=None):
    """Each backend's output for its batch (on the CPU), the same q/k/v for both."""
    n = batches[0].num_tokens
    q = torch.randn(n, NUM_HEADS, HEAD_DIM, generator=g)
    k = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=g)
    outs = []
    for backend, batch in zip((TorchNativeAttnBackend(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, 0.125),
                               TritonAttnBackend(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, 0.125)),
                              batches):
        on = batch.kv_pool.device
        backend.prepare(batch)
        outs.append(backend.forward(q.to(on), k.to(on), v.to(on), layer_id, batch,
                                    window=window).cpu())
        pool = batch.kv_pool
        # the backend wrote the new K/V
        assert torch.equal(pool.k[layer_id][batch.out_slots].cpu(), k)
        assert torch.equal(pool.v[layer_id][batch.out_slots].cpu(), v)
    return outs


def test_extend_then_decode_agree_with_torch_native(kernel_device):
    g = torch.Generator().manual_seed(0)
    pools = Pools(kernel_device)
    rows = [3, 0, 5, 6]
    layer = 1
    # a first extend fills prefixes for requests 0..2 (request 3 has none)
    first = make_batch(ForwardMode.EXTEND, pools, rows[:3], [0, 0, 0], [9, 33, 2])
    want, got = run_both(first, layer, g)
    torch.testing.assert_close(got, want, **TOL)
    # mixed: cached prefixes of 9 / 33 / 2 tokens and one empty prefix, extends of 1..40
    mixed = make_batch(ForwardMode.EXTEND, pools, rows, [9, 33, 2, 0], [1, 40, 7, 5])
    want, got = run_both(mixed, layer, g)
    torch.testing.assert_close(got, want, **TOL)
    decode = make_batch(ForwardMode.DECODE, pools, rows, [10, 73, 9, 5], [1, 1, 1, 1])
    want, got = run_both(decode, layer, g)
    torch.testing.assert_close(got, want, **TOL)


def test_bad_head_counts_raise():
    with pytest.raises(ValueError, match="multiple"):
        TritonAttnBackend(6, 4, 64, 0.125)


def test_decode_over_a_shared_prefix_agrees_with_torch_native(kernel_device):
    """Rows that begin with the same 70 slots (as the radix cache hands a shared prompt out):
    the backend plans the shared prefix once (prepare) and every layer attends over it for all
    of them together."""
    g = torch.Generator().manual_seed(1)
    pools = Pools(kernel_device)
    first = make_batch(ForwardMode.EXTEND, pools, [2], [0], [70])
    run_both(first, 0, g)
    pools.copy_rows([5, 6], 2)  # rows 5 and 6 share row 2's prefix
    own = make_batch(ForwardMode.EXTEND, pools, [2, 5, 6], [70, 70, 70], [3, 1, 9])
    run_both(own, 0, g)
    # 2 and 5 consecutive: one group; 6 follows the lone request 3, so it attends alone
    decode = make_batch(ForwardMode.DECODE, pools, [2, 5, 3, 6], [73, 71, 0, 79], [1, 1, 1, 1])
    want, got = run_both(decode, 0, g)
    assert decode[1].attn_metadata.shared_prefix.lens.tolist() == [70, 70, 0, 0]
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("window", [6, 33, 200])
def test_windowed_layers_agree_with_torch_native(kernel_device, window):
    """A sliding window shorter than some contexts (6: than every prefix; 33: than some) and
    longer than all (200), in extend and decode batches, over a shared prefix too (a windowed
    decode attends alone; the forward's plan keeps the cascade for unwindowed layers)."""
    g = torch.Generator().manual_seed(2)
    pools = Pools(kernel_device)
    first = make_batch(ForwardMode.EXTEND, pools, [2, 4], [0, 0], [70, 20])
    want, got = run_both(first, 0, g, window)
    torch.testing.assert_close(got, want, **TOL)
    pools.copy_rows([5], 2)
    mixed = make_batch(ForwardMode.EXTEND, pools, [2, 5, 4], [70, 70, 20], [3, 40, 1])
    want, got = run_both(mixed, 0, g, window)
    torch.testing.assert_close(got, want, **TOL)
    decode = make_batch(ForwardMode.DECODE, pools, [2, 5, 4], [73, 110, 21], [1, 1, 1])
    want, got = run_both(decode, 0, g, window)
    torch.testing.assert_close(got, want, **TOL)
    assert decode[1].attn_metadata.shared_prefix.lens.tolist() == [70, 70, 0]
