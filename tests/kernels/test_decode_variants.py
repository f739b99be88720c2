"""The Triton decode kernels' variants are a small fixed set, all compiled at start-up.

The split count a batch gets is always one of decode_plan.KV_SPLIT_CHOICES (any SM count,
batch and length), and TritonAttnBackend.warm_up launches every variant a serving backend can:
after it, prepare + forward over many batches (lone and shared-prefix requests, short and long)
make no launch whose compile key (constexprs, triton's integer and pointer specialisations,
dtypes) warm_up did not already make.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from radixflow.kernels.triton import decode_attention, extend_attention
from radixflow.kernels.triton.decode_plan import (
    CPU_SPLIT_CHOICES,
    KV_SPLIT_CHOICES,
    choose_num_kv_splits,
    decode_variants,
    num_kv_splits_for,
    programs_per_split,
)
from radixflow.runtime.attention.triton_backend import TritonAttnBackend
from radixflow.runtime.forward_batch import ForwardBatch, ForwardMode
from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

HEADS = [(9, 3), (32, 8), (32, 4), (8, 8), (128, 1)]


def test_the_split_count_is_always_one_of_the_fixed_set():
    lengths = [0, 1, 63, 64, 65, 255, 256, 511, 1000, 4096, 8191, 32768, 131072, 10**6]
    for num_sms, bs, (heads, kv_heads), length in itertools.product(
            [1, 16, 78, 108, 132, 144], [1, 2, 3, 7, 16, 64, 100, 256, 1024], HEADS, lengths):
        splits = num_kv_splits_for(num_sms, programs_per_split(bs, heads, kv_heads), length)
        assert splits in KV_SPLIT_CHOICES, (num_sms, bs, heads, kv_heads, length)
        longer = num_kv_splits_for(num_sms, programs_per_split(bs, heads, kv_heads), 2 * length)
        assert longer >= splits  # a longer context never gets fewer splits
    for length in lengths:
        assert choose_num_kv_splits(torch.device("cpu"), 4, length) in CPU_SPLIT_CHOICES


def test_the_split_count_fills_the_gpu_without_short_splits():
    # one request, 3 KV heads on 132 SMs: length decides, rounded down to a power of two
    assert num_kv_splits_for(132, 3, 4096) == 16
    assert num_kv_splits_for(132, 3, 3000) == 8  # 11 splits of >= 256 tokens -> 8
    assert num_kv_splits_for(132, 3, 100) == 1
    assert num_kv_splits_for(132, 3, 10**6) == KV_SPLIT_CHOICES[-1]
    # 64 requests x 4 KV heads: 256 programs a split, 1056 wanted -> 4
    assert num_kv_splits_for(132, 64 * 4, 4096) == 4


def test_the_variants_to_compile_cover_every_choice():
    cuda = torch.device("cuda")
    assert decode_variants(cuda, 9, 3) == [(n, s) for n in KV_SPLIT_CHOICES for s in (False, True)]
    assert decode_variants(cuda, 128, 1) == [(n, False) for n in KV_SPLIT_CHOICES]  # no cascade
    assert decode_variants(cuda, 9, 3, num_kv_splits=5) == [(5, False), (5, True)]
    assert decode_variants(torch.device("cpu"), 9, 3) == [
        (n, s) for n in CPU_SPLIT_CHOICES for s in (False, True)]


class LaunchLog:
    """Wraps kernels so each launch records its compile key: what triton specialises on."""

    def __init__(self, monkeypatch):
        self.keys: set[tuple] = set()
        for module, name in ((decode_attention, "_decode_split_kernel"),
                             (decode_attention, "_decode_merge_kernel"),
                             (decode_attention, "_shared_prefix_kernel"),
                             (extend_attention, "_extend_attention_kernel")):
            monkeypatch.setattr(module, name, _Recorded(getattr(module, name), name, self.keys))


class _Recorded:
    def __init__(self, kernel, name: str, keys: set):
        self.kernel, self.name, self.keys = kernel, name, keys
        # arguments triton does not specialise on (do_not_specialize; the interpreter keeps
        # the decorator's kwargs)
        names = getattr(kernel, "do_not_specialize", None)
        if names is None:
            names = getattr(kernel, "kwargs", {}).get("do_not_specialize") or []
        self.unspecialised = {kernel.arg_names.index(n) if isinstance(n, str) else n
                              for n in names}

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.keys.add((self.name, tuple(int if i in self.unspecialised else _spec(a)
                                            for i, a in enumerate(args)),
                           tuple(sorted((k, _spec(v)) for k, v in kwargs.items()))))
            return launch(*args, **kwargs)

        return run


def _spec(value):
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value == 1, value % 16 == 0
    if isinstance(value, float):
        return float
    return value


def decode_batch(pools, seq_lens, shared_prefix: int):
    """A decode batch over the pools: requests whose rows begin with `shared_prefix` common
    slots (0: none) and then slots of their own."""
    kv_pool, rows = pools
    common = kv_pool.alloc(shared_prefix) if shared_prefix else None
    table = rows.req_to_token
    for i, n in enumerate(seq_lens):
        own = kv_pool.alloc(n - shared_prefix)
        table[i, :n] = (own if common is None else torch.cat([common, own])).int()
    bs = len(seq_lens)

    def t(values):
        return torch.tensor(values, dtype=torch.int64, device=kv_pool.device)

    return ForwardBatch(
        mode=ForwardMode.DECODE, input_ids=t([0] * bs), positions=t([n - 1 for n in seq_lens]),
        out_slots=t([int(table[i, n - 1]) for i, n in enumerate(seq_lens)]),
        req_pool_indices=t(list(range(bs))), seq_lens=t(seq_lens), prefix_lens=t(
            [n - 1 for n in seq_lens]), extend_lens=t([1] * bs), seq_lens_cpu=list(seq_lens),
        prefix_lens_cpu=[n - 1 for n in seq_lens], extend_lens_cpu=[1] * bs,
        logits_indices=t(list(range(bs))), req_to_token=table, kv_pool=kv_pool)


# GQA groups of 2 and 3 (both within decode_plan.SHARED_ROWS: the cascade is in play)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 2), (6, 2)])
def test_serving_launches_only_variants_the_warm_up_compiled(num_heads, num_kv_heads,
                                                               monkeypatch, kernel_device):
    head_dim = 32
    log = LaunchLog(monkeypatch)
    backend = TritonAttnBackend(num_heads, num_kv_heads, head_dim, head_dim ** -0.5)
    cases = [([5], 0), ([1, 30, 64], 0), ([65, 200], 0), ([70, 90, 66], 64), ([64, 64], 64),
             ([300, 120, 500, 99, 260], 96)]
    num_slots = sum(sum(lens) for lens, _ in cases) + 16
    pools = (KVPool(num_slots, 1, num_kv_heads, head_dim, torch.float32, kernel_device),
             ReqToTokenPool(8, 512, kernel_device))
    backend.warm_up(pools[0], pools[1].req_to_token)
    warmed = set(log.keys)
    assert {key[0] for key in warmed} == {"_decode_split_kernel", "_decode_merge_kernel",
                                          "_shared_prefix_kernel", "_extend_attention_kernel"}
    log.keys.clear()
    g = torch.Generator().manual_seed(0)
    planned = set()
    for seq_lens, shared_prefix in cases:
        batch = decode_batch(pools, seq_lens, shared_prefix)
        backend.prepare(batch)
        plan = batch.attn_metadata
        planned.add((plan.num_kv_splits, plan.shared_prefix is not None
                     and bool(plan.shared_prefix.lens.any())))
        q = torch.randn(len(seq_lens), num_heads, head_dim, generator=g).to(kernel_device)
        kv = torch.randn(len(seq_lens), num_kv_heads, head_dim, generator=g).to(kernel_device)
        backend.forward(q, kv, kv, 0, batch)
    assert {splits for splits, _ in planned} >= ({1, 2} if kernel_device.type == "cpu" else {1})
    assert {shared for _, shared in planned} == {False, True}
    assert log.keys and log.keys <= warmed, log.keys - warmed


def test_a_windowed_backend_warms_up_its_windowed_variants(monkeypatch, kernel_device):
    """TritonAttnBackend(windowed=True) (a model with sliding-window layers): serving windowed
    and unwindowed layers, decode and extend, launches only what warm_up compiled."""
    num_heads, num_kv_heads, head_dim = 4, 2, 32
    log = LaunchLog(monkeypatch)
    backend = TritonAttnBackend(num_heads, num_kv_heads, head_dim, head_dim ** -0.5,
                                windowed=True)
    pools = (KVPool(2000, 1, num_kv_heads, head_dim, torch.float32, kernel_device),
             ReqToTokenPool(8, 512, kernel_device))
    backend.warm_up(pools[0], pools[1].req_to_token)
    warmed = set(log.keys)
    log.keys.clear()
    g = torch.Generator().manual_seed(0)
    for seq_lens, shared_prefix in [([5], 0), ([1, 30, 64], 0), ([70, 90, 66], 64),
                                    ([300, 120], 0)]:
        batch = decode_batch(pools, seq_lens, shared_prefix)
        backend.prepare(batch)
        q = torch.randn(len(seq_lens), num_heads, head_dim, generator=g).to(kernel_device)
        kv = torch.randn(len(seq_lens), num_kv_heads, head_dim, generator=g).to(kernel_device)
        for window in (None, 16):
            backend.forward(q, kv, kv, 0, batch, window=window)
        extend = dataclasses.replace(batch, mode=ForwardMode.EXTEND)
        backend.prepare(extend)
        for window in (None, 16):
            backend.forward(q, kv, kv, 0, extend, window=window)
    windowed = {key for key in log.keys if ("WINDOWED", True) in key[2]}
    assert {key[0] for key in windowed} == {"_decode_split_kernel", "_extend_attention_kernel"}
    assert log.keys <= warmed, log.keys - warmed
