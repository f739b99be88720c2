"""Attention with torch ops only: gather each request's K/V through the token table, pad the
batch to its longest request, and run one attention call for the whole batch.

Decode lays the query heads that share a KV head along the query axis ([bs, kv_heads, group,
head_dim]), so grouped-query attention needs no copy of K/V. When every request of a decode
batch shares a prefix of KV slots (a shared system prompt, forked branches), that prefix is
gathered and attended once for the whole batch ("cascade"), and merged with each request's own
suffix by log-sum-exp.

Extend batches over a bf16 pool, on a CPU whose build of radixflow's kernels takes the model's
dtype (bf16 at avx512, fp32 at avx2), run each request through `kernels.cpu.prefill` instead:
causal attention as blocked products read straight from the pool, no gather, pad or mask.

An int8 pool (--kv-cache-dtype int8, kernels/kv_int8.py) is read the same ways: the kernel
takes its codes and scales in place; the torch paths dequantize what they gather (a request's
or a block's keys, never the whole pool) to the queries' dtype; the queries are rotated as the
pool's keys are (KVPool.rotate_queries).

A sliding-window layer (`forward(..., window=w)`: the query at position p sees keys
p - w < k <= p) whose window is shorter than some request's context gets plans of its own,
made at its first layer and kept for the rest of the forward: decode gathers each request's
last w keys (no cascade); extend splits each request's new tokens into blocks of at most
max(w, WINDOW_BLOCK) queries, each gathering only the keys its queries' windows reach, under
one banded mask (not the CPU prefill kernel, which attends over the whole prefix). Windows
that reach every request's first key use the forward's plans as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ...kernels import kv_int8
from ...kernels.cpu import active_level
from ...kernels.cpu import prefill as cpu_prefill
from ..forward_batch import ForwardBatch, ForwardMode

# KV pool dtypes kernels.cpu.prefill reads in place
_KERNEL_KV = (torch.bfloat16, torch.int8)
# Shared prefixes shorter than this are not worth a second attention call.
CASCADE_MIN_PREFIX = 64
# A windowed extend attends blocks of at most max(window, this) queries of a request, each over
# the keys its windows reach: the padded keys and the mask stay within 2 x the window a query.
WINDOW_BLOCK = 256
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


@dataclass
class _ExtendPlan:
    kv_slots: torch.Tensor  # [bs, max_seq_len] int64 (padding -> slot 0)
    mask: torch.Tensor | None  # [bs, 1, max_q_len, max_seq_len] bool, None when not needed
    is_causal: bool  # a single request with no prefix: SDPA's own causal mask
    q_rows: torch.Tensor | None  # [bs * max_q_len] row of each padded query in the token dim
    token_rows: torch.Tensor | None  # [num_tokens] padded position of each real token
    max_q_len: int
    # a single request extending a prefix: its queries attend to the prefix (no mask) and to
    # their own keys (causal) in two flash calls merged by log-sum-exp; a mask over the
    # whole would make the kernel visit every block of the upper triangle
    split_prefix: int = 0
    windowed: dict[int, Any] = field(default_factory=dict)  # window -> its plan (None: as this)


@dataclass
class _KernelExtendPlan:
    requests: cpu_prefill.BatchPrefill
    windowed: dict[int, Any] = field(default_factory=dict)


@dataclass
class _DecodePlan:
    kv_slots: torch.Tensor  # [bs, suffix_len] int64: keys after the shared prefix (pad -> 0)
    mask: torch.Tensor | None  # [bs, 1, 1, suffix_len] additive, None when no padding
    prefix_slots: torch.Tensor | None  # [prefix_len] slots every request shares, or None
    # first slot of kv_slots / prefix_slots when they are one run of consecutive slots (the
    # pool hands out ascending slots): read as a view of the pool, not gathered
    kv_run_start: int | None = None
    prefix_run_start: int | None = None
    windowed: dict[int, Any] = field(default_factory=dict)


class TorchNativeAttnBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 cpu_dtype: torch.dtype | None = None):
        """cpu_dtype: the queries are CPU tensors of this dtype, so extend batches over a bf16
        pool may use kernels.cpu.prefill where the kernels in force take it (bf16 at avx512,
        fp32 at avx2); the level is fixed here, as the model's weights are at load."""
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = scale
        self.prefill_level = None
        if cpu_dtype is not None and cpu_prefill.supported(num_heads, num_kv_heads, head_dim,
                                                           cpu_dtype):
            self.prefill_level = active_level()

    # ---- planning (once per forward) ----

    def prepare(self, batch: ForwardBatch) -> None:
        if batch.mode == ForwardMode.DECODE:
            batch.attn_metadata = self._plan_decode(batch)
        else:
            batch.attn_metadata = self._plan_extend(batch)

    def _plan_decode(self, batch: ForwardBatch) -> _DecodePlan:
        seq_lens = batch.seq_lens_cpu
        max_seq, min_seq = max(seq_lens), min(seq_lens)
        rows = batch.req_to_token[batch.req_pool_indices, :max_seq].long()  # [bs, max_seq]
        prefix_len = 0
        if batch.batch_size > 1 and min_seq > CASCADE_MIN_PREFIX:
            same = (rows[:, :min_seq - 1] == rows[:1, :min_seq - 1]).all(dim=0)
            prefix_len = int(same.int().cumprod(0).sum())
        if prefix_len < CASCADE_MIN_PREFIX:
            prefix_len = 0
        suffix = rows[:, prefix_len:]
        mask = None
        if min_seq != max_seq:
            key_pos = torch.arange(prefix_len, max_seq, device=rows.device)
            valid = key_pos[None, :] < batch.seq_lens[:, None]
            suffix = suffix.masked_fill(~valid, 0)
            mask = torch.zeros(valid.shape, dtype=_mask_dtype(batch), device=rows.device)
            mask = mask.masked_fill(~valid, float("-inf"))[:, None, None, :]
        prefix = rows[0, :prefix_len] if prefix_len else None
        kv_run = _run_start(suffix[0]) if batch.batch_size == 1 else None
        prefix_run = _run_start(prefix) if prefix is not None else None
        return _DecodePlan(suffix, mask, prefix, kv_run, prefix_run)

    def _plan_extend(self, batch: ForwardBatch) -> _ExtendPlan | _KernelExtendPlan:
        bs = batch.batch_size
        if self.prefill_level and batch.kv_pool.k[0].dtype in _KERNEL_KV and all(
                cpu_prefill.worth_it(new, seq - new, self.prefill_level)
                for seq, new in zip(batch.seq_lens_cpu, batch.extend_lens_cpu)):
            table = batch.req_to_token[batch.req_pool_indices]
            requests = [(new, seq - new, table[i, :seq])
                        for i, (seq, new) in enumerate(zip(batch.seq_lens_cpu,
                                                           batch.extend_lens_cpu))]
            return _KernelExtendPlan(cpu_prefill.BatchPrefill(
                requests, self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
                self.prefill_level))
        seq_lens, ext_lens = batch.seq_lens_cpu, batch.extend_lens_cpu
        max_seq, max_q = max(seq_lens), max(ext_lens)
        device = batch.input_ids.device
        rows = batch.req_to_token[batch.req_pool_indices, :max_seq].long()  # [bs, max_seq]
        key_pos = torch.arange(max_seq, device=device)
        uniform = min(seq_lens) == max_seq and min(ext_lens) == max_q
        key_valid = key_pos[None, :] < batch.seq_lens[:, None]  # [bs, max_seq]
        kv_slots = rows.masked_fill(~key_valid, 0) if not uniform else rows

        is_causal = bs == 1 and batch.prefix_lens_cpu[0] == 0 and max_q > 1
        split_prefix = batch.prefix_lens_cpu[0] if bs == 1 and max_q > 1 else 0
        mask = None
        if max_q == 1:
            if not uniform:
                mask = key_valid[:, None, None, :]
        elif not is_causal and not split_prefix:
            # query j of request i sits at position prefix_i + j and sees keys 0..prefix_i + j
            q_pos = batch.prefix_lens[:, None] + torch.arange(max_q, device=device)[None, :]
            mask = (key_pos[None, None, :] <= q_pos[:, :, None]) & key_valid[:, None, :]
            mask = mask[:, None]  # [bs, 1, max_q, max_seq]
        q_rows = token_rows = None
        if bs > 1 and not uniform and max_q > 1:
            starts = torch.tensor([0] + ext_lens[:-1], device=device).cumsum(0)
            offs = torch.arange(max_q, device=device)
            valid = offs[None, :] < batch.extend_lens[:, None]
            token_rows = (torch.arange(bs, device=device)[:, None] * max_q + offs[None, :])[valid]
            q_rows = (starts[:, None] + offs[None, :]).masked_fill(~valid, 0).reshape(-1)
            # padded query rows would see no key at all if masked out entirely; let them see key 0
            if mask is not None:
                mask = mask | (~valid)[:, None, :, None] & (key_pos == 0)[None, None, None, :]
        return _ExtendPlan(kv_slots, mask, is_causal, q_rows, token_rows, max_q, split_prefix)

    def _plan_window(self, batch: ForwardBatch, window: int) -> _ExtendPlan | _DecodePlan | None:
        """The plan of a layer that attends through `window`; None where the window reaches
        every request's first key (the forward's own plan computes it)."""
        if max(batch.seq_lens_cpu) <= window:
            return None
        if batch.mode == ForwardMode.DECODE:
            return self._plan_decode_window(batch, window)
        return self._plan_extend_window(batch, window)

    def _plan_decode_window(self, batch: ForwardBatch, window: int) -> _DecodePlan:
        """Each request's last `window` keys (or all it has), padded to the longest."""
        device = batch.seq_lens.device
        counts = [min(n, window) for n in batch.seq_lens_cpu]
        width = max(counts)
        first = (batch.seq_lens - window).clamp(min=0)  # each request's first key seen
        offs = torch.arange(width, device=device)
        valid = offs[None, :] < (batch.seq_lens - first)[:, None]  # [bs, width]
        cols = (first[:, None] + offs[None, :]).masked_fill(~valid, 0)
        slots = batch.req_to_token[batch.req_pool_indices[:, None], cols].long()
        slots = slots.masked_fill(~valid, 0)
        mask = None
        if min(counts) != width:
            mask = torch.zeros(valid.shape, dtype=_mask_dtype(batch), device=device)
            mask = mask.masked_fill(~valid, float("-inf"))[:, None, None, :]
        kv_run = _run_start(slots[0]) if batch.batch_size == 1 else None
        return _DecodePlan(slots, mask, None, kv_run)

    def _plan_extend_window(self, batch: ForwardBatch, window: int) -> _ExtendPlan:
        """Blocks of each request's new tokens (at most max(window, WINDOW_BLOCK) queries) as
        the rows of one padded attention: block b's keys are positions
        max(0, first_b - window + 1) .. last_b, masked to each query's window."""
        device = batch.input_ids.device
        size = max(window, WINDOW_BLOCK)
        req, q_first, q_count, t_first = [], [], [], []  # per block
        token = 0
        for i, (prefix, new) in enumerate(zip(batch.prefix_lens_cpu, batch.extend_lens_cpu)):
            for j in range(0, new, size):
                req.append(i)
                q_first.append(prefix + j)
                q_count.append(min(size, new - j))
                t_first.append(token + j)
            token += new
        k_first = [max(0, p - window + 1) for p in q_first]
        max_q = max(q_count)
        max_k = max(p + n - k for p, n, k in zip(q_first, q_count, k_first))
        t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
        q_first_t, q_count_t, k_first_t = t(q_first), t(q_count), t(k_first)
        k_pos = k_first_t[:, None] + torch.arange(max_k, device=device)[None, :]  # [blocks, k]
        k_valid = k_pos < (q_first_t + q_count_t)[:, None]
        table_rows = batch.req_pool_indices[t(req)]
        slots = batch.req_to_token[table_rows[:, None], k_pos.masked_fill(~k_valid, 0)].long()
        slots = slots.masked_fill(~k_valid, 0)
        q_offs = torch.arange(max_q, device=device)
        q_pos = q_first_t[:, None] + q_offs[None, :]  # [blocks, q]
        q_valid = q_offs[None, :] < q_count_t[:, None]
        kp, qp = k_pos[:, None, :], q_pos[:, :, None]
        mask = (kp <= qp) & (kp > qp - window) & k_valid[:, None, :]
        # padded query rows would see no key at all if masked out entirely; let them see key 0
        first_key = torch.arange(max_k, device=device) == 0
        mask = mask | ((~q_valid)[:, :, None] & first_key[None, None, :])
        q_rows = token_rows = None
        if len(req) > 1 and min(q_count) != max_q:
            q_rows = (t(t_first)[:, None] + q_offs[None, :]).masked_fill(~q_valid, 0).reshape(-1)
            blocks = torch.arange(len(req), device=device)
            token_rows = (blocks[:, None] * max_q + q_offs[None, :])[q_valid]
        return _ExtendPlan(slots, mask[:, None], False, q_rows, token_rows, max_q)

    # ---- attention (every layer) ----

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch, *, window: int | None = None) -> torch.Tensor:
        batch.kv_pool.write(layer_id, batch.out_slots, k, v)
        k_pool, v_pool = batch.kv_pool.layer(layer_id)
        q = batch.kv_pool.rotate_queries(q)
        plan = batch.attn_metadata
        if window is not None:
            if window not in plan.windowed:  # the forward's first layer with this window
                plan.windowed[window] = self._plan_window(batch, window)
            plan = plan.windowed[window] or plan
        if batch.mode == ForwardMode.DECODE:
            return self._decode(q, k_pool, v_pool, plan)
        return self._extend(q, k_pool, v_pool, plan)

    def _decode(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                plan: _DecodePlan) -> torch.Tensor:
        bs = q.shape[0]
        kvh, g, d = self.num_kv_heads, self.group, self.head_dim
        queries = q.view(bs, kvh, g, d)  # the heads of a group ride the query axis
        # [bs, kv_heads, suffix, head_dim]
        keys = _read(k_pool, plan.kv_slots, plan.kv_run_start, q.dtype).transpose(1, 2)
        values = _read(v_pool, plan.kv_slots, plan.kv_run_start, q.dtype).transpose(1, 2)
        mask = None if plan.mask is None else _as(plan.mask, q.dtype)
        out, lse = _flash(queries, keys, values, 0.0, False, attn_mask=mask, scale=self.scale)
        if plan.prefix_slots is not None:
            # all requests' queries against the shared prefix, gathered once
            shared_q = queries.transpose(0, 1).reshape(1, kvh, bs * g, d)
            run = plan.prefix_run_start
            shared_k = _read(k_pool, plan.prefix_slots, run, q.dtype).transpose(0, 1).unsqueeze(0)
            shared_v = _read(v_pool, plan.prefix_slots, run, q.dtype).transpose(0, 1).unsqueeze(0)
            out_p, lse_p = _flash(shared_q, shared_k, shared_v, 0.0, False, scale=self.scale)
            out_p = out_p.view(kvh, bs, g, d).transpose(0, 1)
            lse_p = lse_p.view(kvh, bs, g).transpose(0, 1)
            out = _merge(out, lse, out_p, lse_p)
        return out.reshape(bs, self.num_heads, d)

    def _extend(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                plan: _ExtendPlan | _KernelExtendPlan) -> torch.Tensor:
        if isinstance(plan, _KernelExtendPlan):
            return plan.requests.run(q, k_pool, v_pool)
        bs = plan.kv_slots.shape[0]  # requests (a windowed plan's: blocks of them)
        # [bs, max_seq, kv_heads, head_dim] -> [bs, kv_heads, max_seq, head_dim]
        keys = _gather(k_pool, plan.kv_slots, q.dtype).transpose(1, 2)
        values = _gather(v_pool, plan.kv_slots, q.dtype).transpose(1, 2)
        if plan.q_rows is not None:
            queries = q[plan.q_rows].view(bs, plan.max_q_len, self.num_heads, self.head_dim)
        else:
            queries = q.view(bs, -1, self.num_heads, self.head_dim)
        if plan.split_prefix:
            return self._extend_after_prefix(queries, keys, values, plan.split_prefix)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys, values, attn_mask=plan.mask,
            is_causal=plan.is_causal, scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [bs, heads, max_q, head_dim]
        out = out.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)
        if plan.token_rows is not None:
            out = out[plan.token_rows]
        return out


    def _extend_after_prefix(self, queries: torch.Tensor, keys: torch.Tensor,
                             values: torch.Tensor, prefix: int) -> torch.Tensor:
        """One request's queries [1, n, heads, d] over keys/values [1, kv_heads, prefix + n, d]:
        the prefix unmasked, its own keys causally (SDPA's causal mask is aligned top-left,
        as query i and key prefix + i share a position)."""
        q = queries.transpose(1, 2)
        out_own, lse_own = _flash(q, keys[:, :, prefix:], values[:, :, prefix:], 0.0, True,
                                  scale=self.scale)
        out_pre, lse_pre = _flash(q, keys[:, :, :prefix], values[:, :, :prefix], 0.0, False,
                                  scale=self.scale)
        out = _merge(out_own, lse_own, out_pre, lse_pre)  # [1, heads, n, d]
        return out.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)


def _run_start(slots: torch.Tensor) -> int | None:
    """slots[0] when the 1-D `slots` are consecutive ascending integers, else None."""
    start = int(slots[0])
    if int(slots[-1]) - start != slots.numel() - 1:
        return None
    return start if bool((slots.diff() == 1).all()) else None


def _read(pool: torch.Tensor | kv_int8.QuantizedRows, slots: torch.Tensor,
          run_start: int | None, dtype: torch.dtype) -> torch.Tensor:
    """pool[slots] for [..., n] slots as `dtype`: a view when they are the run run_start..
    (one request) and the pool holds that dtype (a 16-bit pool under an fp32 model: a copy;
    an int8 pool: the run's slots dequantized)."""
    if run_start is None:
        return _gather(pool, slots, dtype)
    n = slots.shape[-1]
    if isinstance(pool, kv_int8.QuantizedRows):
        return kv_int8.run(pool, run_start, n, dtype).view(*slots.shape, *pool.shape[1:])
    return _as(pool[run_start:run_start + n].view(*slots.shape, *pool.shape[1:]), dtype)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as `dtype` (a 16-bit KV pool under an fp32 model); `.to` costs a dispatch even when it
    has nothing to do, and this path runs a few times per layer."""
    return t if t.dtype == dtype else t.to(dtype)


def _gather(pool: torch.Tensor | kv_int8.QuantizedRows, slots: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:
    """pool[slots] as `dtype` for [num_slots, heads, dim] pools (index_select is several times
    faster); an int8 pool's rows are dequantized after the gather, never the whole pool."""
    if isinstance(pool, kv_int8.QuantizedRows):
        return kv_int8.gather(pool, slots, dtype)
    return _as(pool.index_select(0, slots.reshape(-1)).view(*slots.shape, *pool.shape[1:]),
               dtype)


def _mask_dtype(batch: ForwardBatch) -> torch.dtype:
    """The additive masks' dtype: the pool's, or fp32 over an int8 pool (the queries' dtype
    is applied where the mask is used)."""
    dtype = batch.kv_pool.k[0].dtype
    return torch.float32 if dtype == torch.int8 else dtype


def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> torch.Tensor:
    """Combine two attention results over disjoint key sets by their log-sum-exps."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).unsqueeze(-1)
    w_b = torch.exp(lse_b - lse).unsqueeze(-1)
    return (out_a.float() * w_a + out_b.float() * w_b).to(out_a.dtype)
