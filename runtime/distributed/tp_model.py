"""The Llama family split over tensor-parallel ranks: one rank's model.

It is runtime/models/llama.py's model built with the rank's ModelArgs (its heads, KV heads,
MLP features and vocab rows: ShardSpec.local_args), with four differences:
- attention and MLP outputs (o_proj, down_proj: row-parallel) are summed over the ranks, and
  so are a mixture-of-experts layer's (each rank runs its own experts: moe.py);
- the embedding looks up the ids in this rank's vocab rows, zeros elsewhere, and sums;
- the head's logits (this rank's vocab rows) are gathered on rank 0.
Everything else (q/k/v and gate/up fused, rope, Qwen2 biases, Qwen3 q/k norms, the KV pool
layout, attention backends, int4 layers on the shard's weights) is the single-device code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..forward_batch import AttentionBackend, ForwardBatch
from ..models.config import ModelArgs
from ..models.feed_forward import FeedForward
from ..models.llama import Attention, LlamaForCausalLM
from ..models.moe import SparseMoe
from .parallel_state import TensorParallel


class VocabParallelEmbedding(nn.Embedding):
    """Rows vocab_start .. vocab_start + num_embeddings - 1 of the embedding; the ranks'
    lookups are summed (each id is found on exactly one rank)."""

    def __init__(self, num_embeddings: int, dim: int, vocab_start: int, tp: TensorParallel):
        super().__init__(num_embeddings, dim)
        self.vocab_start, self.tp = vocab_start, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0))


class TPAttention(Attention):
    def __init__(self, args: ModelArgs, layer_id: int, tp: TensorParallel):
        super().__init__(args, layer_id)
        self.tp = tp

    def forward(self, x: torch.Tensor, batch: ForwardBatch, rope: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionBackend) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x, batch, rope, attn))


class TPFeedForward(FeedForward):
    def __init__(self, args: ModelArgs, tp: TensorParallel):
        super().__init__(args)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class TPSparseMoe(SparseMoe):
    def __init__(self, args: ModelArgs, tp: TensorParallel):
        super().__init__(args, experts=tp.spec.experts)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))


class TPLlamaForCausalLM(LlamaForCausalLM):
    """One rank's model. Build it on the 'meta' device, then load ShardSpec.shard_weights."""

    def __init__(self, args: ModelArgs, tp: TensorParallel):
        local = tp.spec.local_args(args)
        super().__init__(local)
        self.tp, self.full_vocab_size = tp, args.vocab_size
        self.embed_tokens = VocabParallelEmbedding(local.vocab_size, local.hidden_size,
                                                   tp.spec.vocab_start, tp)
        for i, block in enumerate(self.layers):
            block.self_attn = TPAttention(local, i, tp)
            moe = local.layer_is_moe(i)
            block.mlp = TPSparseMoe(local, tp) if moe else TPFeedForward(local, tp)

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor | None:
        """Rank 0: float32 logits of the wanted rows, [rows, vocab]; other ranks: None."""
        return self.tp.gather_vocab(super().forward(batch, attn), self.full_vocab_size)
