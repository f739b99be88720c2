"""One request's decode step as one torch.compile'd graph (`--enable-torch-compile`).

A single-stream decode step on a CPU spends much of its time between the matmuls: some
thirty small ATen calls per layer (norms, rope, residuals, attention plumbing), each paying
the dispatcher's overhead. Compiled, each layer's small ops fuse into a few generated kernels
and the thirty layers run as one call, a third less time a step in eager torch ops
(bench/results/decode-step.md#2026-11-29-compiled). The price is compiling at start-up (the log
says how long; less once inductor's cache is warm), so it is opt-in.

It covers the single-stream case: a decode batch of one request adding one token. Anything
else (batches, prefill, jump-forward rows) runs the eager model.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from ..forward_batch import ForwardBatch, ForwardMode
from ..memory_pool import KVPool
from .llama import LlamaForCausalLM

logger = logging.getLogger(__name__)


def decode_layers(layers: list, norm: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, out_slot: torch.Tensor, kv_slots: torch.Tensor,
                  k_pools: list[torch.Tensor], v_pools: list[torch.Tensor],
                  scale: float) -> torch.Tensor:
    """x [1, hidden] through every layer and the final norm. The new token's K/V go to
    `out_slot`; each layer then attends over the pool slots `kv_slots` [kv_len], a layer with
    a sliding window over the last `window` of them."""
    kv_len = kv_slots.shape[0]
    for layer, k_pool, v_pool in zip(layers, k_pools, v_pools):
        attn = layer.self_attn
        q, k, v = attn.project(layer.input_layernorm(x), (cos, sin))
        k_pool.index_copy_(0, out_slot, k)
        v_pool.index_copy_(0, out_slot, v)
        kv_heads, head_dim = attn.num_kv_heads, attn.head_dim
        keys = k_pool.index_select(0, kv_slots).unsqueeze(0).transpose(1, 2)
        values = v_pool.index_select(0, kv_slots).unsqueeze(0).transpose(1, 2)
        # the query heads of a KV group ride the query axis, as in TorchNativeAttnBackend
        queries = q.reshape(1, kv_heads, attn.num_heads // kv_heads, head_dim)
        window = attn.window
        # a mask rather than a slice: slicing kv_len - window would guard (and recompile) on
        # whether the context has outgrown the window yet
        mask = None if window is None else (
            torch.arange(kv_len, device=kv_slots.device) >= kv_len - window).view(1, 1, 1, -1)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
        # (Block._scaled: Granite's residual multiplier; partial / no RoPE is in `project`)
        x = x + layer._scaled(attn.o_proj(out.reshape(1, attn.q_size)))
        x = x + layer._scaled(layer.mlp(layer.post_attention_layernorm(x)))
    return norm(x)


class SingleRequestDecode:
    def __init__(self, model: LlamaForCausalLM, scale: float):
        self.model = model
        self.scale = scale
        self._compiled = torch.compile(decode_layers, dynamic=True)
        self.calls = 0

    @staticmethod
    def accepts(batch: ForwardBatch) -> bool:
        return batch.mode == ForwardMode.DECODE and batch.num_tokens == 1

    @torch.inference_mode()
    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """Logits (float32) of the batch's one token: [1, vocab]."""
        self.calls += 1
        kv_slots = batch.req_to_token[batch.req_pool_indices[0], :batch.seq_lens_cpu[0]].long()
        return self._run(batch.input_ids, batch.positions, batch.out_slots, kv_slots,
                         batch.kv_pool)

    def _run(self, input_ids: torch.Tensor, positions: torch.Tensor, out_slot: torch.Tensor,
             kv_slots: torch.Tensor, kv_pool: KVPool) -> torch.Tensor:
        model = self.model
        x = model.embed(input_ids)
        cos, sin = model.rope.tables(positions, x.dtype)
        h = self._compiled(list(model.layers), model.norm, x, cos, sin, out_slot, kv_slots,
                           kv_pool.k, kv_pool.v, self.scale)
        return model.logits(h)

    @torch.inference_mode()
    def warm_up(self, kv_pool: KVPool) -> None:
        """Compile now rather than on the first request. Writes only the padding slot 0."""
        args = self.model.args
        if args.family in ("gemma2", "gemma3") or args.num_experts:  # (run eagerly instead)
            raise NotImplementedError(f"{args.architecture}'s blocks are not in the "
                                      "compiled decode step")
        start = time.monotonic()
        logger.info("compiling the single-request decode step (torch.compile; about a minute "
                    "on 2 cores the first time)")
        zero = torch.zeros(1, dtype=torch.int64, device=kv_pool.k[0].device)
        # 3 keys: torch.compile specializes sizes 0 and 1
        self._run(zero, zero + 2, zero, torch.zeros(3, dtype=torch.int64, device=zero.device),
                  kv_pool)
        logger.info("decode step compiled in %.0f s", time.monotonic() - start)
