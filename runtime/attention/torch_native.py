"""Attention with torch ops only: gather each request's K/V through the token table, pad the
batch to its longest request, and run one scaled_dot_product_attention for the whole batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..forward_batch import ForwardBatch, ForwardMode


@dataclass
class _Plan:
    kv_slots: torch.Tensor  # [bs, max_seq_len] int64 (padding -> slot 0)
    mask: torch.Tensor | None  # [bs, 1, max_q_len, max_seq_len] bool, None when not needed
    is_causal: bool  # a single request with no prefix: SDPA's own causal mask
    q_rows: torch.Tensor | None  # [bs * max_q_len] row of each padded query in the token dim
    token_rows: torch.Tensor | None  # [num_tokens] padded position of each real token
    max_q_len: int


class TorchNativeAttnBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale

    def prepare(self, batch: ForwardBatch) -> None:
        bs = batch.batch_size
        seq_lens, ext_lens = batch.seq_lens_cpu, batch.extend_lens_cpu
        max_seq, max_q = max(seq_lens), max(ext_lens)
        device = batch.input_ids.device
        rows = batch.req_to_token[batch.req_pool_indices, :max_seq].long()  # [bs, max_seq]
        key_pos = torch.arange(max_seq, device=device)
        uniform = min(seq_lens) == max_seq and min(ext_lens) == max_q
        key_valid = key_pos[None, :] < batch.seq_lens[:, None]  # [bs, max_seq]
        kv_slots = rows.masked_fill(~key_valid, 0) if not uniform else rows

        is_causal = bs == 1 and batch.prefix_lens_cpu[0] == 0 and max_q > 1
        mask = None
        if batch.mode == ForwardMode.DECODE or max_q == 1:
            if not uniform:
                mask = key_valid[:, None, None, :]
        elif not is_causal:
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
        batch.attn_metadata = _Plan(kv_slots, mask, is_causal, q_rows, token_rows, max_q)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int,
                batch: ForwardBatch) -> torch.Tensor:
        plan: _Plan = batch.attn_metadata
        batch.kv_pool.write(layer_id, batch.out_slots, k, v)
        bs = batch.batch_size
        # [bs, max_seq, kv_heads, head_dim] -> [bs, kv_heads, max_seq, head_dim]
        keys = batch.kv_pool.k[layer_id][plan.kv_slots].transpose(1, 2)
        values = batch.kv_pool.v[layer_id][plan.kv_slots].transpose(1, 2)
        if plan.q_rows is not None:
            queries = q[plan.q_rows].view(bs, plan.max_q_len, self.num_heads, self.head_dim)
        else:
            queries = q.view(bs, -1, self.num_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            queries.transpose(1, 2), keys, values, attn_mask=plan.mask,
            is_causal=plan.is_causal, scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )  # [bs, heads, max_q, head_dim]
        out = out.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)
        if plan.token_rows is not None:
            out = out[plan.token_rows]
        return out
