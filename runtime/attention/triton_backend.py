"""The Triton attention backend: writes the new tokens' K/V into the pool, then runs the
extend or split-KV decode kernel over the token-slot table (radixflow.kernels.attention).

On CUDA, `warm_up` compiles every kernel variant it can launch before the first request: the
decode split count comes from a small fixed set (kernels/triton/decode_plan.py); a backend
made `windowed` (a model with sliding-window layers) compiles the windowed variants too.

A layer's `window` goes to both kernels (the query at position p sees keys
p - window < k <= p); a windowed decode attends each request alone (no shared-prefix cascade)
with the split count of the window's length. A window that reaches every key of the batch
runs the unwindowed kernels.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

import torch

from radixflow.kernels.attention import decode_attention, extend_attention

from ..forward_batch import ForwardBatch, ForwardMode
from ..memory_pool import KVPool

logger = logging.getLogger(__name__)


@dataclass
class _Plan:
    """What every layer of one forward shares."""

    extend_starts: torch.Tensor | None  # [bs] int64: first token row of each request (EXTEND)
    max_extend_len: int
    max_seq_len: int
    num_kv_splits: int | None  # DECODE: one of decode_plan.KV_SPLIT_CHOICES (or the fixed one)
    shared_prefix: object = None  # DECODE: requests attending over a shared prefix together
    window_splits: dict[int, int] = field(default_factory=dict)  # DECODE: a window's splits


class TritonAttnBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 *, num_kv_splits: int | None = None, windowed: bool = False,
                 dtype: torch.dtype | None = None):
        """windowed: some layer attends through a sliding window (warm_up compiles for it);
        dtype: the model's (the queries' over an int8 KV pool; default bf16)."""
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} must be a positive multiple of "
                             f"num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self.num_kv_splits = num_kv_splits
        self.windowed = windowed
        self.dtype = dtype or torch.bfloat16

    def warm_up(self, kv_pool: KVPool, req_to_token: torch.Tensor) -> None:
        """Compile every variant of the extend and decode kernels this backend can launch
        over these pools (one launch each; they read the table, write only their outputs)."""
        from radixflow.kernels.triton.decode_attention import warm_up_decode_attention
        from radixflow.kernels.triton.extend_attention import warm_up_extend_attention

        started = time.perf_counter()
        k_cache, v_cache = kv_pool.layer(0)  # every layer's alike
        q_dtype = self.dtype if kv_pool.is_int8 else None
        guard = (torch.cuda.device(kv_pool.device) if kv_pool.device.type == "cuda"
                 else contextlib.nullcontext())
        with guard:  # triton launches on the current device: make it the pool's
            warm_up_extend_attention(k_cache, v_cache, req_to_token, num_heads=self.num_heads,
                                     scale=self.scale, windowed=self.windowed, q_dtype=q_dtype)
            count = warm_up_decode_attention(k_cache, v_cache, req_to_token,
                                             num_heads=self.num_heads, scale=self.scale,
                                             num_kv_splits=self.num_kv_splits,
                                             windowed=self.windowed, q_dtype=q_dtype)
            if kv_pool.device.type == "cuda":
                torch.cuda.synchronize(kv_pool.device)
        logger.info("Triton attention: extend and %d decode variants compiled in %.1f s",
                    count, time.perf_counter() - started)

    def prepare(self, batch: ForwardBatch) -> None:
        max_seq_len = max(batch.seq_lens_cpu, default=0)
        if batch.mode == ForwardMode.DECODE:
            from radixflow.kernels.triton import decode_plan

            shared = None
            if decode_plan.shares_prefixes(self.num_heads, self.num_kv_heads):
                shared = decode_plan.plan_shared_prefix(
                    batch.req_to_token, batch.req_pool_indices, batch.seq_lens,
                    max_seq_len=max_seq_len)
            splits = self.num_kv_splits or decode_plan.choose_num_kv_splits(
                batch.seq_lens.device,
                decode_plan.programs_per_split(batch.batch_size, self.num_heads,
                                               self.num_kv_heads),
                max_seq_len)
            batch.attn_metadata = _Plan(None, 1, max_seq_len, splits, shared)
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
        *,
        window: int | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if not isinstance(batch.attn_metadata, _Plan):
            self.prepare(batch)
        plan: _Plan = batch.attn_metadata
        if window is not None and plan.max_seq_len <= window:
            window = None  # it sees every key of the batch
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        pool = batch.kv_pool
        pool.write(layer_id, batch.out_slots, k, v)
        k_cache, v_cache = pool.layer(layer_id)
        out_dtype = q.dtype
        if pool.is_int8:  # the kernels dequantize the codes to q's dtype
            # the new tokens' K/V as the pool holds them (keys rotated, as the queries), so
            # extend and later decodes agree
            q = pool.rotate_queries(q)
            k, v = pool.as_stored(layer_id, k, v, q.dtype)
        else:
            q = q.to(k_cache.dtype)  # tl.dot wants one dtype on both sides
            k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        if batch.mode == ForwardMode.DECODE:
            splits, shared = plan.num_kv_splits, plan.shared_prefix
            if window is not None:
                splits, shared = self._window_splits(plan, window, batch), None
            out = decode_attention(
                q, k_cache, v_cache, batch.req_to_token, batch.req_pool_indices,
                batch.seq_lens, scale=self.scale, num_kv_splits=splits,
                max_seq_len=plan.max_seq_len, shared_prefix=shared, window=window,
                backend="triton")
            return out.to(out_dtype)
        # The new tokens' K/V as the pool holds them, so extend and later decodes agree.
        out = extend_attention(
            q, k, v, k_cache, v_cache, batch.req_to_token,
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, plan.extend_starts,
            scale=self.scale, max_extend_len=plan.max_extend_len, window=window,
            backend="triton")
        return out.to(out_dtype)

    def _window_splits(self, plan: _Plan, window: int, batch: ForwardBatch) -> int:
        """The decode split count of a layer that reads at most `window` keys a request."""
        if window not in plan.window_splits:
            from radixflow.kernels.triton import decode_plan

            plan.window_splits[window] = self.num_kv_splits or decode_plan.choose_num_kv_splits(
                batch.seq_lens.device,
                decode_plan.programs_per_split(batch.batch_size, self.num_heads,
                                               self.num_kv_heads),
                min(plan.max_seq_len, window))
        return plan.window_splits[window]
