"""A model split over tensor-parallel ranks: one rank's model.

It is the family's single-device model (runtime/models/llama.py, gemma.py) built with the
rank's ModelArgs (its heads, KV heads, MLP features and vocab rows: ShardSpec.local_args),
with these differences:
- attention and MLP outputs (o_proj, down_proj: row-parallel) are summed over the ranks, and
  so are a mixture-of-experts layer's (each rank runs its own experts: moe.py);
- the embedding looks up the ids in this rank's vocab rows, zeros elsewhere, and sums;
- the head's logits (this rank's vocab rows) are gathered on rank 0;
- q/k norms over the whole projection (OLMoE) take their mean square over the ranks.
Everything else (q/k/v and gate/up fused, rope, Qwen2 biases, Qwen3 q/k norms, Gemma's norms,
GeGLU, soft-caps and windows, the KV pool layout, attention backends, int4 layers on the
shard's weights) is the single-device code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..forward_batch import AttentionBackend, ForwardBatch
from ..models.config import ModelArgs
from ..models.gemma import GemmaForCausalLM
from ..models.llama import LlamaForCausalLM, meta_embedding_weight
from ..models.moe import SparseMoe
from ..models.registry import model_class
from .parallel_state import TensorParallel


class VocabParallelEmbedding(nn.Embedding):
    """Rows vocab_start .. vocab_start + num_embeddings - 1 of the embedding; the ranks'
    lookups are summed (each id is found on exactly one rank)."""

    def __init__(self, num_embeddings: int, dim: int, vocab_start: int, tp: TensorParallel):
        super().__init__(num_embeddings, dim, _weight=meta_embedding_weight(num_embeddings, dim))
        self.vocab_start, self.tp = vocab_start, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill_(outside[:, None], 0))


def _summed_over_ranks(module: nn.Module, tp: TensorParallel) -> None:
    """`module`'s output is this rank's part of a sum (a row-parallel o_proj or down_proj, a
    rank's experts): it is summed over the ranks, whatever the family's block."""
    module.register_forward_hook(lambda _module, _inputs, out: tp.all_reduce(out))


class TPLlamaForCausalLM(LlamaForCausalLM):
    """One rank's model. Build it on the 'meta' device (`tp_model_class(args)(args, tp)`),
    then load ShardSpec.shard_weights."""

    def __init__(self, args: ModelArgs, tp: TensorParallel):
        local = tp.spec.local_args(args)
        super().__init__(local)  # the family's single-device model, at this rank's sizes
        self.tp, self.full_vocab_size = tp, args.vocab_size
        self.embed_tokens = VocabParallelEmbedding(local.vocab_size, local.hidden_size,
                                                   tp.spec.vocab_start, tp)
        for i, block in enumerate(self.layers):
            if local.layer_is_moe(i):  # this rank's experts only
                block.mlp = SparseMoe(local, experts=tp.spec.experts)
            _summed_over_ranks(block.self_attn, tp)
            _summed_over_ranks(block.mlp, tp)
            if not local.qk_norm_per_head:  # OLMoE: its norms' statistics span the ranks
                block.self_attn.ranks_mean = lambda t: tp.all_reduce(t) / tp.size

    def forward(self, batch: ForwardBatch, attn: AttentionBackend) -> torch.Tensor | None:
        """Rank 0: float32 logits of the wanted rows, [rows, vocab]; other ranks: None."""
        return self.tp.gather_vocab(super().forward(batch, attn), self.full_vocab_size)


class TPGemmaForCausalLM(TPLlamaForCausalLM, GemmaForCausalLM):
    """Gemma 2 / 3 (gemma.py's blocks) split as Llama's: each rank attends its heads over its
    KV heads, the (1 + w) post norms follow the sums, the scaled embedding the vocab-parallel
    lookup. The final soft-cap is elementwise: each rank caps its vocab rows' logits before
    they are gathered, the same numbers capping the gathered logits gives."""


def tp_model_class(args: ModelArgs) -> type[TPLlamaForCausalLM]:
    """The family's tensor-parallel model (runtime/models/registry.py's choice, split)."""
    return TPGemmaForCausalLM if model_class(args) is GemmaForCausalLM else TPLlamaForCausalLM
