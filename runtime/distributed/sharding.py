"""Which part of the model one tensor-parallel rank holds (Megatron-style), and its weights.

- q/k/v and gate/up are column-parallel: rank r holds a contiguous block of attention heads,
  of KV heads and of the MLP's intermediate features (rows of those weights, and of q/k/v's
  biases); o_proj and down_proj are row-parallel: the matching columns, and their outputs are
  summed over the ranks (an all-reduce, see tp_model.py).
- KV heads: split when --tp-size divides their count; when --tp-size is a multiple of it, each
  KV head is replicated on tp_size / num_kv_heads ranks (as SGLang does), and each rank holds
  one, the one its query heads read.
- The embedding and the output head are vocab-parallel: rank r holds rows
  [r * shard, (r + 1) * shard) with shard = ceil(vocab / tp_size), the last rank's tail padded
  with zero rows (logits of padding rows are dropped when the ranks' logits are gathered).
- Norms (q/k norms of Qwen3 and Gemma 3 too: per head_dim) are replicated; OLMoE's q/k norms
  over the whole projection are split as q / k's rows, their mean square taken over the ranks
  (tp_model.py).
- Phi-3's fused qkv_proj / gate_up_proj tensors are split into their parts, each sharded as
  above; o_proj / down_proj biases (attention_bias, mlp_bias) are rank 0's (zeros elsewhere),
  so the all-reduce adds them once. Granite's multipliers, partial rotary and NoPE layers are
  per-rank arithmetic that needs no split.
- Mixture of experts: the experts are split (expert parallel): rank r holds a contiguous
  block of num_experts / tp_size whole experts, renumbered from 0 in its model, and the router
  whole; Qwen2-MoE's shared expert is split like a dense MLP (its sigmoid gate replicated: it
  scales each rank's partial sum alike). A rank's MoE output is summed over the ranks as an
  MLP's is.
- Gemma 2 / 3 split as Llama does (their (1 + w) norms, soft-caps and windows are per-rank
  arithmetic).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..models.config import ModelArgs
from .split import check_split


@dataclass(frozen=True)
class ShardSpec:
    """Rank `rank`'s part of a model split over `tp_size` ranks (ranges are (start, count))."""

    tp_size: int
    rank: int
    head_dim: int
    heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab_start: int
    vocab_rows: int  # rows of this rank's embedding / head shard (padding included)
    vocab_size: int  # the model's
    num_kv_heads: int  # the model's
    experts: tuple[int, int] = (0, 0)  # this rank's routed experts (first, count)
    shared_intermediate: tuple[int, int] = (0, 0)  # its part of Qwen2-MoE's shared expert

    @classmethod
    def create(cls, args: ModelArgs, tp_size: int, rank: int) -> ShardSpec:
        check_split(args, tp_size)
        heads = args.num_heads // tp_size
        kv = args.num_kv_heads
        if tp_size <= kv:
            kv_heads = (rank * (kv // tp_size), kv // tp_size)
        else:  # replicated: the KV head of this rank's query heads
            kv_heads = (rank * kv // tp_size, 1)
        inter = args.intermediate_size // tp_size
        rows = -(-args.vocab_size // tp_size)
        experts = args.num_experts // tp_size
        shared = args.shared_expert_intermediate_size // tp_size
        return cls(tp_size, rank, args.head_dim, (rank * heads, heads), kv_heads,
                   (rank * inter, inter), rank * rows, rows, args.vocab_size, kv,
                   (rank * experts, experts), (rank * shared, shared))

    @property
    def kv_replicas(self) -> int:
        """Ranks holding each KV head (1: split, not replicated)."""
        return max(1, self.tp_size // self.num_kv_heads)

    def local_args(self, args: ModelArgs) -> ModelArgs:
        """The ModelArgs of this rank's model: its heads, KV heads, features and vocab rows."""
        return dataclasses.replace(args, num_heads=self.heads[1], num_kv_heads=self.kv_heads[1],
                                   intermediate_size=self.intermediate[1],
                                   shared_expert_intermediate_size=self.shared_intermediate[1],
                                   vocab_size=self.vocab_rows)

    def describe(self) -> str:
        h, kv, i, e = self.heads, self.kv_heads, self.intermediate, self.experts
        experts = f", experts {e[0]}..{e[0] + e[1] - 1}" if e[1] else ""
        return (f"rank {self.rank}/{self.tp_size}: heads {h[0]}..{h[0] + h[1] - 1}, KV heads "
                f"{kv[0]}..{kv[0] + kv[1] - 1}, MLP features {i[0]}..{i[0] + i[1] - 1}"
                f"{experts}, vocab rows {self.vocab_start}.."
                f"{self.vocab_start + self.vocab_rows - 1}")

    # ---- weights ----

    def shard(self, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the checkpoint tensor `hf_name` (HF naming)."""
        d = self.head_dim
        parts = hf_name.split(".")
        module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", hf_name)
        if module == "q_proj":
            return _rows(tensor, self.heads[0] * d, self.heads[1] * d)
        if module in ("k_proj", "v_proj"):
            return _rows(tensor, self.kv_heads[0] * d, self.kv_heads[1] * d)
        if module in ("q_norm", "k_norm") and tensor.shape[0] != d:  # whole projection (OLMoE)
            return self.shard(f"{module[0]}_proj.{kind}", tensor)
        if module == "qkv_proj":  # fused in the checkpoint (Phi-3): each part's rows
            q, kv = self.heads[1] * self.tp_size * d, self.num_kv_heads * d
            return torch.cat([self.shard(f"q_proj.{kind}", tensor[:q]),
                              self.shard(f"k_proj.{kind}", tensor[q:q + kv]),
                              self.shard(f"v_proj.{kind}", tensor[q + kv:])])
        if module == "gate_up_proj":
            gate, up = tensor.chunk(2, dim=0)
            return torch.cat([_rows(gate, *self.intermediate), _rows(up, *self.intermediate)])
        if module == "o_proj" and kind == "weight":
            return tensor[:, self.heads[0] * d:(self.heads[0] + self.heads[1]) * d]
        if module in ("gate_proj", "up_proj"):
            return _rows(tensor, *self.intermediate)
        if module == "down_proj" and kind == "weight":
            return tensor[:, self.intermediate[0]:sum(self.intermediate)]
        if module in ("o_proj", "down_proj") and kind == "bias":  # added once, by rank 0
            return tensor if self.rank == 0 else torch.zeros_like(tensor)
        if module in ("embed_tokens", "lm_head") and kind == "weight":
            piece = tensor[self.vocab_start:self.vocab_start + self.vocab_rows]
            if piece.shape[0] < self.vocab_rows:  # the last rank's padding
                pad = piece.new_zeros(self.vocab_rows - piece.shape[0], *piece.shape[1:])
                piece = torch.cat([piece, pad])
            return piece
        return tensor

    def shard_weights(self, weights: Iterable[tuple[str, torch.Tensor]]
                      ) -> Iterator[tuple[str, torch.Tensor]]:
        first, count = self.experts
        for name, tensor in weights:
            if count and (m := _EXPERT.search(name)):  # whole experts: this rank's, renumbered
                if m["index"] is None:  # stacked [experts, ...] (transformers >= 5)
                    yield name, tensor[first:first + count]
                elif first <= (e := int(m["index"])) < first + count:
                    yield f"{name[:m.start()]}.experts.{e - first}.{m['rest']}", tensor
                continue
            if self.shared_intermediate[1] and ".shared_expert." in name:
                yield name, self._shard_mlp(name, tensor, self.shared_intermediate)
                continue
            yield name, self.shard(name, tensor)

    def _shard_mlp(self, hf_name: str, tensor: torch.Tensor, features: tuple[int, int]
                   ) -> torch.Tensor:
        """gate/up rows and down columns `features` of an MLP that is not the layer's own."""
        module = hf_name.split(".")[-2]
        if module == "down_proj":
            return tensor[:, features[0]:sum(features)]
        return _rows(tensor, *features)


# a routed expert's tensor: experts.N.<rest> (per expert) or experts.gate_up_proj (stacked)
_EXPERT = re.compile(r"\.experts\.(?:(?P<index>\d+)\.)?(?P<rest>.+)$")


def _rows(tensor: torch.Tensor, start: int, count: int) -> torch.Tensor:
    return tensor[start:start + count]
