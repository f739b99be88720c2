"""The Triton attention backend: writes the new tokens' K/V into the pool, then runs the
extend or split-KV decode kernel over the token-slot table (radixflow.kernels.attention)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from radixflow.kernels.attention import decode_attention, extend_attention

from ..forward_batch import ForwardBatch, ForwardMode


@dataclass
class _Plan:
    """What every layer of one forward shares."""

    extend_starts: torch.Tensor | None  # [bs] int64: first token row of each request (EXTEND)
    max_extend_len: int
    max_seq_len: int
    num_kv_splits: int | None  # DECODE: None lets the kernel choose
    shared_prefix: object = None  # DECODE: requests attending over a shared prefix together


class TritonAttnBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 *, num_kv_splits: int | None = None):
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} must be a positive multiple of "
                             f"num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.num_kv_splits = num_kv_splits

    def prepare(self, batch: ForwardBatch) -> None:
        max_seq_len = max(batch.seq_lens_cpu, default=0)
        if batch.mode == ForwardMode.DECODE:
            from radixflow.kernels.triton.decode_attention import plan_shared_prefix

            shared = plan_shared_prefix(batch.req_to_token, batch.req_pool_indices,
                                        batch.seq_lens, max_seq_len=max_seq_len)
            batch.attn_metadata = _Plan(None, 1, max_seq_len, self.num_kv_splits, shared)
            return
        starts = list(itertools.accumulate(batch.extend_lens_cpu[:-1], initial=0))
        extend_starts = torch.tensor(starts, dtype=torch.int64).to(batch.input_ids.device,
                                                                   non_blocking=True)
        batch.attn_metadata = _Plan(extend_starts, max(batch.extend_lens_cpu, default=0),
                                    max_seq_len, None)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        batch: ForwardBatch,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if not isinstance(batch.attn_metadata, _Plan):
            self.prepare(batch)
        plan: _Plan = batch.attn_metadata
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        pool = batch.kv_pool
        pool.write(layer_id, batch.out_slots, k, v)
        k_cache, v_cache = pool.k[layer_id], pool.v[layer_id]
        out_dtype = q.dtype
        q = q.to(k_cache.dtype)  # tl.dot wants one dtype on both sides
        if batch.mode == ForwardMode.DECODE:
            out = decode_attention(
                q, k_cache, v_cache, batch.req_to_token, batch.req_pool_indices,
                batch.seq_lens, scale=self.scale, num_kv_splits=plan.num_kv_splits,
                max_seq_len=plan.max_seq_len, shared_prefix=plan.shared_prefix,
                backend="triton")
            return out.to(out_dtype)
        # The new tokens' K/V as the pool holds them, so extend and later decodes agree.
        out = extend_attention(
            q, k.to(k_cache.dtype), v.to(v_cache.dtype), k_cache, v_cache, batch.req_to_token,
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, plan.extend_starts,
            scale=self.scale, max_extend_len=plan.max_extend_len, backend="triton")
        return out.to(out_dtype)
