"""Paged attention inputs for the kernel tests: a KV pool and token table holding requests at
scattered slots (tests/kernels/test_attention.py, test_attention_window.py)."""

from __future__ import annotations

import torch

from radixflow.kernels.attention import extend_attention

TOL = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def make_paged(prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim, dtype, *, seed=0,
               device="cpu"):
    """A KV pool holding each request's prefix and new tokens at scattered slots, plus the
    new tokens' q/k/v laid out one request after another (made on the CPU, moved to device)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    num_slots = sum(seq_lens) + 7
    k_cache = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_slots + 1, num_kv_heads, head_dim, generator=g).to(dtype)
    req_to_token = torch.zeros(len(seq_lens) + 3, max(seq_lens) + 5, dtype=torch.int32)
    rows = torch.randperm(req_to_token.shape[0], generator=g)[:len(seq_lens)]
    slots = torch.randperm(num_slots, generator=g) + 1
    out_slots, used = [], 0
    for row, prefix_len, seq_len in zip(rows.tolist(), prefix_lens, seq_lens):
        req_to_token[row, :seq_len] = slots[used:used + seq_len].int()
        out_slots.append(slots[used + prefix_len:used + seq_len])
        used += seq_len
    out_slots = torch.cat(out_slots)
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    starts = torch.tensor([0] + extend_lens[:-1]).cumsum(0)
    case = {"q": q, "k": k_cache[out_slots].clone(), "v": v_cache[out_slots].clone(),
            "k_cache": k_cache, "v_cache": v_cache, "req_to_token": req_to_token,
            "req_pool_indices": rows, "prefix_lens": torch.tensor(prefix_lens),
            "extend_lens": torch.tensor(extend_lens), "extend_starts": starts,
            "seq_lens": torch.tensor(seq_lens)}
    return {name: t.to(device) for name, t in case.items()}


def run_extend(case, backend, scale):
    keys = ("q", "k", "v", "k_cache", "v_cache", "req_to_token", "req_pool_indices",
            "prefix_lens", "extend_lens", "extend_starts")
    return extend_attention(*(case[k] for k in keys), scale=scale, backend=backend)


def make_shared(groups, *, num_heads, num_kv_heads, head_dim, dtype, seed=0, device="cpu"):
    """A KV pool and table whose rows (in batch order, at scattered table rows) are groups of
    requests sharing a prefix: `groups` lists, per group, (prefix length, each member's own
    length); a prefix of 0 makes lone requests. Made on the CPU, moved to device."""
    g = torch.Generator().manual_seed(seed)
    total = sum(p + sum(own) for p, own in groups) + 8
    k_cache = torch.randn(total + 1, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(total + 1, num_kv_heads, head_dim, generator=g).to(dtype)
    free = iter((torch.randperm(total, generator=g) + 1).tolist())
    rows = []
    for prefix_len, own in groups:
        prefix = [next(free) for _ in range(prefix_len)]
        rows += [prefix + [next(free) for _ in range(n)] for n in own]
    seq_lens = [len(r) for r in rows]
    req_to_token = torch.zeros(len(rows) + 3, max(seq_lens) + 5, dtype=torch.int32)
    table_rows = torch.randperm(req_to_token.shape[0], generator=g)[:len(rows)]
    for row, slots in zip(table_rows.tolist(), rows):
        req_to_token[row, :len(slots)] = torch.tensor(slots, dtype=torch.int32)
    q = torch.randn(len(rows), num_heads, head_dim, generator=g).to(dtype)
    made = (q, k_cache, v_cache, req_to_token, table_rows, torch.tensor(seq_lens))
    return tuple(t.to(device) for t in made)
