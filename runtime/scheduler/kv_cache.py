"""Who owns which KV slot: the radix tree, the request rows, the free pool.

    free slots + slots in the tree + slots held by live requests (beyond their tree part)
    == the pool's size, checked by `check` whenever the scheduler idles.
"""

from __future__ import annotations

import torch

from radixflow.radix_cache import RadixTree

from ..errors import InvariantBroken
from ..memory_pool import KVPool, ReqToTokenPool
from .req import Req


class KVCache:
    def __init__(self, tree: RadixTree, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool):
        self.tree, self.kv_pool, self.req_to_token_pool = tree, kv_pool, req_to_token_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self.num_evicted_tokens = 0  # tree tokens evicted to make room (the /dashboard)

    def try_alloc(self, n: int) -> torch.Tensor | None:
        """n free slots, evicting unlocked tree leaves if needed; None if they cannot be had."""
        if n > self.kv_pool.num_free:
            short = n - self.kv_pool.num_free
            evicted = cat_slots(self.tree.evict(short))
            self.num_evicted_tokens += len(evicted)
            self.kv_pool.free(evicted)
        return self.kv_pool.alloc(n)

    def alloc(self, n: int) -> torch.Tensor:
        slots = self.try_alloc(n)
        if slots is None:
            raise RuntimeError(f"KV pool exhausted: needed {n} slots, admission should "
                               "prevent this")
        return slots

    def release(self, req: Req) -> None:
        """Hand the request's computed tokens to the tree, unlock, give back its row. Slots
        computed past its tokens (a verify pass's drafts, a token taken back) are freed: the
        tree only gets the request's own tokens."""
        self.drop_uncomputed(req)
        n = req.computed_len
        if req.window_freed is not None:  # only the part before the gap can join the tree
            first, below = req.window_freed
            self.kv_pool.free(self.req_to_token[req.req_pool_idx, below:n].long())
            n, req.window_freed = first, None
        slots = self.req_to_token[req.req_pool_idx, :n].long()
        if self.tree.disabled:
            self.kv_pool.free(slots)
        else:
            dup = self.tree.insert(req.fill_ids[:n], slots.clone(), namespace=req.cache_salt)
            if dup > req.tree_len:
                self.kv_pool.free(slots[req.tree_len:dup])
        self.tree.unlock(req.last_node)
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx, req.last_node, req.tree_len, req.computed_len = None, None, 0, 0

    def cache_unfinished(self, req: Req) -> None:
        """Insert what the request has computed so far and re-point its row at the tree."""
        if self.tree.disabled or req.window_freed is not None:  # (a gap: nothing to share)
            return
        n = req.computed_len
        key = req.fill_ids[:n]
        slots = self.req_to_token[req.req_pool_idx, :n].long()
        dup = self.tree.insert(key, slots.clone(), namespace=req.cache_salt)
        if dup > req.tree_len:
            self.kv_pool.free(slots[req.tree_len:dup])
        match = self.tree.match_prefix(key, namespace=req.cache_salt)
        self.req_to_token[req.req_pool_idx, :match.length] = cat_slots(match.values).to(torch.int32)
        self.tree.lock(match.last_node)
        self.tree.unlock(req.last_node)
        req.last_node, req.tree_len = match.last_node, match.length

    def drop_uncomputed(self, req: Req) -> None:
        """Free the KV computed past the request's tokens (those were taken back)."""
        if req.req_pool_idx is not None and req.computed_len > req.seq_len:
            dropped = self.req_to_token[req.req_pool_idx, req.seq_len:req.computed_len]
            self.kv_pool.free(dropped.long())
            req.computed_len = req.seq_len

    def flush(self) -> None:
        """Drop the whole tree (only when no request holds a lock)."""
        self.kv_pool.free(cat_slots(self.tree.reset()))

    def check(self, live: list[Req]) -> None:
        """The slot-conservation invariant; call when the scheduler is between steps."""
        held = sum(r.owned_slots for r in live)
        total = self.kv_pool.num_free + self.tree.total_size() + held
        if total != self.kv_pool.num_slots:
            raise InvariantBroken(
                f"KV slot leak: free {self.kv_pool.num_free} + tree {self.tree.total_size()} + "
                f"requests {held} != {self.kv_pool.num_slots}")
        self.tree.check()


def evictable_len(node) -> int:
    """Unlocked tokens on the tree path to `node`: locking it takes them out of the evictable
    pool, so admitting a request that matched them costs that much KV budget."""
    num_tokens = 0
    while node.parent is not None:
        if node.lock_ref == 0:
            num_tokens += len(node.key)
        node = node.parent
    return num_tokens


def cat_slots(values: list) -> torch.Tensor:
    if not values:
        return torch.empty(0, dtype=torch.int64)
    return torch.cat([v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.int64)
                      for v in values]).long()
