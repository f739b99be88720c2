"""Gemma 2 and Gemma 3 (text) on the Llama blocks, as transformers' modeling_gemma2/3 compute:

- RMSNorm scales by (1 + w), in fp32, then casts (GemmaRMSNorm); four norms a layer (input,
  post-attention, pre- and post-feedforward), the sums taken after the post norms;
- GeGLU: gelu (tanh approximation) of the gate times up;
- embeddings scaled by sqrt(hidden_size) rounded to the model dtype;
- the softmax scale query_pre_attn_scalar ** -0.5; attention logits soft-capped
  (tanh(s / cap) * cap, Gemma 2's attn_logit_softcapping) and the final logits too;
- sliding-window layers (layer_types): a query at position p sees keys p - window < k <= p;
  Gemma 3's local layers rotate with their own base (rope_local_base_freq), its global ones
  with rope_theta and its scaling; Gemma 3 normalises q and k per head.

Attention here reads each request's keys from the KV pool and computes the scores itself
(soft-capping and windows are what the shared backends do not do): one request at a time, in
torch ops, on any device. The C decode step and the compiled decode do not run these blocks
(model_runner falls back to this module); tensor parallelism splits them as Llama's
(runtime/distributed/tp_model.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import kv_int8
from ..forward_batch import AttentionBackend, ForwardBatch
from .config import ModelArgs
from .feed_forward import FeedForward
from .llama import Attention, Block, LlamaForCausalLM, RMSNorm
from .rope import RotaryEmbedding

Tables = tuple[torch.Tensor, torch.Tensor]


class GemmaRMSNorm(RMSNorm):
    def add_forward(self, x: torch.Tensor, delta: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        if delta is not None:
            x = x + delta
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return x, (h * (1.0 + self.weight.float())).to(x.dtype)


class GemmaFeedForward(FeedForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaAttention(Attention):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        if args.qk_norm:  # Gemma 3
            self.q_norm = GemmaRMSNorm(args.head_dim, args.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(args.head_dim, args.rms_norm_eps)
        self.scale, self.softcap = args.attn_scale, args.attn_softcap

    def forward(self, x: torch.Tensor, batch: ForwardBatch, rope: Tables,
                attn: AttentionBackend) -> torch.Tensor:
        q, k, v = self.project(x, rope)
        batch.kv_pool.write(self.layer_id, batch.out_slots, k, v)
        out = torch.cat([self._attend(q[start:start + n], batch, i, n)
                         for i, (start, n) in enumerate(_spans(batch.extend_lens_cpu))])
        return self.o_proj(out.reshape(-1, self.q_size))

    def _attend(self, q: torch.Tensor, batch: ForwardBatch, i: int, n: int) -> torch.Tensor:
        """Request i's n queries [n, heads, d] over its keys in the pool -> [n, heads, d]."""
        seq = batch.seq_lens_cpu[i]
        q = batch.kv_pool.rotate_queries(q)
        slots = batch.req_to_token[batch.req_pool_indices[i], :seq].long()
        group = self.num_heads // self.num_kv_heads
        keys, values = (_gather(pool, slots, q.dtype).repeat_interleave(group, dim=1)
                        .transpose(0, 1)
                        for pool in batch.kv_pool.layer(self.layer_id))  # [heads, seq, d]
        scores = torch.matmul(q.transpose(0, 1), keys.transpose(1, 2)) * self.scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        q_pos = torch.arange(seq - n, seq, device=q.device)[:, None]
        k_pos = torch.arange(seq, device=q.device)[None, :]
        visible = k_pos <= q_pos
        if self.window is not None:
            visible &= q_pos - k_pos < self.window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, values).transpose(0, 1)


class GemmaBlock(Block):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__(args, layer_id)
        norm = (args.hidden_size, args.rms_norm_eps)
        self.input_layernorm = GemmaRMSNorm(*norm)
        self.post_attention_layernorm = GemmaRMSNorm(*norm)
        self.pre_feedforward_layernorm = GemmaRMSNorm(*norm)
        self.post_feedforward_layernorm = GemmaRMSNorm(*norm)
        self.self_attn = GemmaAttention(args, layer_id)
        self.mlp = GemmaFeedForward(args)
        self.local = layer_id in args.window_layers and args.rope_local_theta is not None

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch,
                rope: tuple[Tables, Tables | None], attn: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = self.input_layernorm.add_forward(x, delta)
        h = self.post_attention_layernorm(self.self_attn(h, batch, rope[self.local], attn))
        x, h = self.pre_feedforward_layernorm.add_forward(x, h)
        return x, self.post_feedforward_layernorm(self.mlp(h))


class GemmaForCausalLM(LlamaForCausalLM):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.layers = nn.ModuleList(GemmaBlock(args, i) for i in range(args.num_layers))
        self.norm = GemmaRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.local_rope = None
        if args.rope_local_theta is not None:  # Gemma 3's local layers
            self.local_rope = RotaryEmbedding(args.head_dim, args.max_position_embeddings,
                                              args.rope_local_theta, None)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        return x * torch.tensor(self.args.hidden_size ** 0.5, dtype=x.dtype)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype
                    ) -> tuple[Tables, Tables | None]:
        """(global tables, local tables or None): GemmaBlock picks its layer's."""
        local = self.local_rope.tables(positions, dtype) if self.local_rope else None
        return self.rope.tables(positions, dtype), local

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        out = self.lm_head(h)
        cap = self.args.final_softcap
        if cap is not None:
            out = torch.tanh(out / cap) * cap
        return out.float()


def _spans(lengths: list[int]) -> list[tuple[int, int]]:
    """(start, length) of each request's tokens along the token dim."""
    starts, total = [], 0
    for n in lengths:
        starts.append((total, n))
        total += n
    return starts


def _gather(pool: torch.Tensor | kv_int8.QuantizedRows, slots: torch.Tensor,
            dtype: torch.dtype) -> torch.Tensor:
    """A layer's K or V at slots as `dtype` (an int8 pool's dequantized)."""
    if isinstance(pool, kv_int8.QuantizedRows):
        return kv_int8.gather(pool, slots, dtype)
    return pool.index_select(0, slots).to(dtype)
