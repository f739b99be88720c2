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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...kernels.cpu import active_level
from ...kernels.cpu import prefill as cpu_prefill
from ..forward_batch import ForwardBatch, ForwardMode

# Shared prefixes shorter than this are not worth a second attention call.
CASCADE_MIN_PREFIX = 64
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


@dataclass
class _KernelExtendPlan:
    requests: cpu_prefill.BatchPrefill


@dataclass
class _DecodePlan:
    kv_slots: torch.Tensor  # [bs, suffix_len] int64: keys after the shared prefix (pad -> 0)
    mask: torch.Tensor | None  # [bs, 1, 1, suffix_len] additive, None when no padding
    prefix_slots: torch.Tensor | None  # [prefix_len] slots every request shares, or None
    # first slot of kv_slots / prefix_slots when they are one run of consecutive slots (the
    # pool hands out ascending slots): read as a view of the pool, not gathered
    kv_run_start: int | None = None
    prefix_run_start: int | None = None


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
            mask = torch.zeros(valid.shape, dtype=batch.kv_pool.k[0].dtype, device=rows.device)
            mask = mask.masked_fill(~valid, float("-inf"))[:, None, None, :]
        prefix = rows[0, :prefix_len] if prefix_len else None
        kv_run = _run_start(suffix[0]) if batch.batch_size == 1 else None
        prefix_run = _run_start(prefix) if prefix is not None else None
        return _DecodePlan(suffix, mask, prefix, kv_run, prefix_run)

    def _plan_extend(self, batch: ForwardBatch) -> _ExtendPlan | _KernelExtendPlan:
        bs = batch.batch_size
        if self.prefill_level and batch.kv_pool.k[0].dtype == torch.bfloat16 and all(
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

    # ---- attention (every layer) ----

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch) -> torch.Tensor:
        batch.kv_pool.write(layer_id, batch.out_slots, k, v)
        k_pool, v_pool = batch.kv_pool.k[layer_id], batch.kv_pool.v[layer_id]
        if batch.mode == ForwardMode.DECODE:
            return self._decode(q, k_pool, v_pool, batch.attn_metadata)
        return self._extend(q, k_pool, v_pool, batch.attn_metadata, batch.batch_size)

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
                plan: _ExtendPlan | _KernelExtendPlan, bs: int) -> torch.Tensor:
        if isinstance(plan, _KernelExtendPlan):
            return plan.requests.run(q, k_pool, v_pool)
        # [bs, max_seq, kv_heads, head_dim] -> [bs, kv_heads, max_seq, head_dim]
        keys = _as(_gather(k_pool, plan.kv_slots), q.dtype).transpose(1, 2)
        values = _as(_gather(v_pool, plan.kv_slots), q.dtype).transpose(1, 2)
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


def _read(pool: torch.Tensor, slots: torch.Tensor, run_start: int | None,
          dtype: torch.dtype) -> torch.Tensor:
    """pool[slots] for [..., n] slots as `dtype`: a view when they are the run run_start..
    (one request) and the pool holds that dtype (a 16-bit pool under an fp32 model: a copy)."""
    if run_start is None:
        return _as(_gather(pool, slots), dtype)
    return _as(pool[run_start:run_start + slots.shape[-1]].view(*slots.shape, *pool.shape[1:]),
               dtype)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t as `dtype` (a 16-bit KV pool under an fp32 model); `.to` costs a dispatch even when it
    has nothing to do, and this path runs a few times per layer."""
    return t if t.dtype == dtype else t.to(dtype)


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """pool[slots] for [num_slots, heads, dim] pools; index_select is several times faster."""
    return pool.index_select(0, slots.reshape(-1)).view(*slots.shape, *pool.shape[1:])


def _merge(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
           lse_b: torch.Tensor) -> torch.Tensor:
    """Combine two attention results over disjoint key sets by their log-sum-exps."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).unsqueeze(-1)
    w_b = torch.exp(lse_b - lse).unsqueeze(-1)
    return (out_a.float() * w_a + out_b.float() * w_b).to(out_a.dtype)
