"""The KV slot pool: slots handed out in ascending runs, taken back LIFO, double frees caught,
and the free-slot stack on the pool's device, so handing out and taking back slots never
reads a device tensor on the host."""

from __future__ import annotations

import pytest
import torch

from radixflow.runtime.errors import InvariantBroken
from radixflow.runtime.memory_pool import KVPool


def test_slots_come_in_ascending_runs_and_go_back_first_out():
    pool = KVPool(8, 1, 1, 4, torch.float32)
    first = pool.alloc(3)
    assert first.tolist() == [1, 2, 3] and first.dtype == torch.int64
    assert pool.alloc(2).tolist() == [4, 5]
    pool.free(first)
    assert pool.num_free == 6
    assert pool.alloc(3).tolist() == [1, 2, 3]  # the freed run, in order
    pool.free([1, 2, 3])  # a list is taken too
    assert pool.alloc(9) is None


def test_freeing_more_than_was_held_is_caught():
    pool = KVPool(4, 1, 1, 4, torch.float32)
    slots = pool.alloc(2)
    pool.free(slots)
    with pytest.raises(InvariantBroken, match="freed twice"):
        pool.free(torch.tensor([1, 2, 3]))


def test_the_free_stack_stays_on_the_pools_device():
    """A meta tensor has no values: alloc/free reading one on the host (.tolist(), .item(),
    .cpu(), a comparison in Python) would raise here, as on CUDA it would wait for the GPU."""
    pool = KVPool(16, 2, 1, 4, torch.float32, device="meta")
    assert pool.device == torch.device("meta") and pool.free_slots().device == pool.device
    slots = pool.alloc(5)
    assert slots.device == pool.device and slots.shape == (5,)
    pool.free(slots[2:])
    pool.free(slots[:2])
    assert pool.num_free == 16
    pool.free(pool.alloc(16))
    assert pool.num_free == 16
