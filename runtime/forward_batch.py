"""What one model forward needs: the batch's tokens, where their K/V go, how to attend.

The attention backend interface lives here too, so that the model, the torch-native backend
and the Triton backend (kernels/) agree on one contract.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from .memory_pool import KVPool


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill: each request adds extend_len >= 1 tokens after its prefix
    DECODE = "decode"  # each request adds exactly one token


@dataclass
class ForwardBatch:
    """Requests are laid out one after another along the token dimension.

    For request i: tokens [token_starts[i], token_starts[i] + extend_lens[i]) of `input_ids`
    sit at positions prefix_lens[i] .. seq_lens[i] - 1; their K/V slots for positions
    0 .. seq_lens[i] - 1 are req_to_token[req_pool_indices[i], :seq_lens[i]] (the new tokens'
    slots, `out_slots`, are already written into that table).
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    out_slots: torch.Tensor  # [num_tokens] int64: KV slot of each new token
    req_pool_indices: torch.Tensor  # [bs] int64: row of each request in req_to_token
    seq_lens: torch.Tensor  # [bs] int64: prefix + new tokens
    prefix_lens: torch.Tensor  # [bs] int64: tokens whose K/V is already in the pool
    extend_lens: torch.Tensor  # [bs] int64: new tokens (1 in DECODE mode)
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    logits_indices: torch.Tensor  # [num_logit_rows] int64: token rows whose logits are returned
    req_to_token: torch.Tensor  # [max_running, max_context] int32
    kv_pool: KVPool
    attn_metadata: Any = None  # built once per forward by AttentionBackend.prepare

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


class AttentionBackend(Protocol):
    """Writes the new tokens' K/V into the pool, then attends over each request's context.

    Causal: a new token at position p attends to positions 0..p of its own request; with a
    `window` (a sliding-window layer) only to positions p - window < k <= p, as transformers'
    sliding_window_causal_mask_function has it.
    """

    def prepare(self, batch: ForwardBatch) -> None:
        """Build whatever index tensors all layers share; store them in batch.attn_metadata."""

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        batch: ForwardBatch,
        *,
        window: int | None = None,  # this layer's sliding window; None: full causal
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...

@dataclass
class BatchRequest:
    """One request's part of a forward: `ids` go in at positions start_pos.. with these slots."""

    req_pool_idx: int  # its row of req_to_token
    ids: list[int]
    start_pos: int
    logit_offsets: list[int]  # offsets within `ids` whose logits are wanted
