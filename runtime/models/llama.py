"""The Llama family (Llama 2/3, SmolLM2/3, Mistral, Qwen2, Qwen3, Granite, Phi-3) over the
token-slot KV pool.

gpt-fast style: Transformer -> Block -> Attention / FeedForward. q/k/v and gate/up are fused
into one matmul each by the weight loader (see `load_weights`; Phi-3's checkpoints hold them
fused already). The families' differences are ModelArgs fields the blocks read: Granite's
multipliers (embedding, residual, softmax scale, logits), SmolLM3's layers without RoPE,
Phi-3's partial rotary width, biases on o_proj and the MLP, the layers' sliding windows
(passed to the attention backend).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from radixflow.kernels.cpu.rows import RowKernels

from ..forward_batch import AttentionBackend, ForwardBatch
from .config import ModelArgs
from .feed_forward import FeedForward
from .rope import RotaryEmbedding, apply_rope


class RMSNorm(nn.Module):
    rows: RowKernels | None = None  # bound at load on a CPU with radixflow's kernels

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.add_forward(x, None)[1]

    def add_forward(self, x: torch.Tensor, delta: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm); the row kernels add into x in place."""
        if self.rows is not None:
            out = self.rows.add_rms_norm(x, delta, self.weight, self.eps)
            if out is not None:
                return x, out
        if delta is not None:
            x = x + delta
        # statistics in fp32, then scale in the model dtype: Hugging Face's order, bit for bit
        return x, F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype) * self.weight

    def with_mean_square(self, x: torch.Tensor, mean_square: torch.Tensor) -> torch.Tensor:
        """x normed by a mean square of its rows taken elsewhere (fp32, [rows, 1]): a tensor-
        parallel rank's part of a whole-projection norm, whose rows span every rank."""
        return (x.float() * torch.rsqrt(mean_square + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    rows: RowKernels | None = None
    # tensor parallelism (tp_model.py): the mean of a per-rank tensor over the ranks, so that
    # norms over the whole projection (OLMoE) take their statistics over every rank's heads
    ranks_mean: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            args.num_heads, args.num_kv_heads, args.head_dim)
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.qkv_proj = nn.Linear(args.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=args.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.o_proj_bias)
        # dims of each head that rotate: all (Llama), the first rotary_dim (Phi-3's partial
        # rotary), none (SmolLM3's NoPE layers)
        self.rotary_dim = args.rope_dim if args.layer_has_rope(layer_id) else 0
        self.window = args.layer_window(layer_id)  # sliding window, or None
        # q/k norms per head (Qwen3) or, qk_norm_per_head False, over the whole projection
        # (OLMoE); OLMoE's clip_qkv clamps q, k and v after them
        self.qk_norm_per_head, self.clip_qkv = args.qk_norm_per_head, args.clip_qkv
        if args.qk_norm:
            per_head = args.qk_norm_per_head
            self.q_norm = RMSNorm(args.head_dim if per_head else self.q_size, args.rms_norm_eps)
            self.k_norm = RMSNorm(args.head_dim if per_head else self.kv_size, args.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, batch: ForwardBatch, rope: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionBackend) -> torch.Tensor:
        q, k, v = self.project(x, rope)
        # [num_tokens, num_heads, head_dim]
        out = attn.forward(q, k, v, self.layer_id, batch, window=self.window)
        return self.o_proj(out.reshape(-1, self.q_size))

    def project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [num_tokens, hidden] -> rotated q [num_tokens, heads, head_dim], rotated k and v
        [num_tokens, kv_heads, head_dim]."""
        qkv = self.qkv_proj(x)
        if not self.qk_norm_per_head or self.clip_qkv is not None:
            qkv = self._whole_norms_and_clip(qkv)
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.qk_norm_per_head:
            qk = torch.cat([self.q_norm(qk[:, :self.num_heads]),
                            self.k_norm(qk[:, self.num_heads:])], dim=1)
        if self.rotary_dim == self.head_dim:
            if self.rows is None or not self.rows.rope_(qk, *rope):  # (in place, qkv rows)
                qk = apply_rope(qk, *rope)  # q and k heads rotated together
        elif self.rotary_dim:  # the tables are rotary_dim wide
            rd = self.rotary_dim
            qk = torch.cat([apply_rope(qk[..., :rd], *rope), qk[..., rd:]], dim=-1)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v

    def _whole_norms_and_clip(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and not self.qk_norm_per_head:
            q, k = self._whole_norms(q, k)
        qkv = torch.cat([q, k, v], dim=-1)
        if self.clip_qkv is not None:
            qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        return qkv

    def _whole_norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ranks_mean is None:
            return self.q_norm(q), self.k_norm(k)
        # each rank holds as many q (k) features as every other: the mean over the ranks of
        # their mean squares is the whole projection's (one collective for q and k)
        squares = torch.stack([q.float().pow(2).mean(-1), k.float().pow(2).mean(-1)], dim=-1)
        squares = self.ranks_mean(squares)
        return (self.q_norm.with_mean_square(q, squares[:, :1]),
                self.k_norm.with_mean_square(k, squares[:, 1:]))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if args.layer_is_moe(layer_id):
            from .moe import SparseMoe

            self.mlp = SparseMoe(args)
        else:
            self.mlp = FeedForward(args)
        self.residual_multiplier = args.residual_multiplier  # Granite's; 1.0 elsewhere

    def forward(self, x: torch.Tensor, delta: torch.Tensor | None, batch: ForwardBatch,
                rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionBackend
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream x and the previous layer's output `delta` (None before the
        first layer) -> this layer's (x, delta): each sum is taken where its norm is."""
        x, h = self.input_layernorm.add_forward(x, delta)
        h = self._scaled(self.self_attn(h, batch, rope, attn))
        x, h = self.post_attention_layernorm.add_forward(x, h)
        return x, self._scaled(self.mlp(h))

    def _scaled(self, out: torch.Tensor) -> torch.Tensor:
        m = self.residual_multiplier
        return out if m == 1.0 else out * m


def meta_embedding_weight(num: int, dim: int) -> torch.Tensor | None:
    """An nn.Embedding's `_weight` that skips its normal_ init where it is built on 'meta'
    (there normal_ goes through torch._refs, whose first call imports torch._dynamo: 2-3 s of
    CPU in every process that builds a model, for weights the loader replaces anyway); None
    (the usual init) elsewhere."""
    weight = torch.empty(num, dim)
    return weight if weight.device.type == "meta" else None


def _embedding(num: int, dim: int) -> nn.Embedding:
    return nn.Embedding(num, dim, _weight=meta_embedding_weight(num, dim))


class LlamaForCausalLM(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = _embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.rope = RotaryEmbedding(args.rope_dim, args.max_position_embeddings,
                                    args.rope_theta, args.rope_scaling)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, attn: AttentionBackend, *,
                hidden: bool = False) -> torch.Tensor:
        """Logits (float32) of the rows in batch.logits_indices: [num_logit_rows, vocab];
        `hidden`: their final normed hidden states instead (float32, [rows, hidden_size]),
        lm_head not run (embeddings)."""
        x, delta = self.embed(batch.input_ids), None
        rope = self.rope_tables(batch.positions, x.dtype)
        for layer in self.layers:
            x, delta = layer(x, delta, batch, rope, attn)
        wanted = batch.logits_indices
        _, x = self.norm.add_forward(x[wanted], delta[wanted])
        return x.float() if hidden else self.logits(x)

    def rope_tables(self, positions: torch.Tensor, dtype: torch.dtype):
        """What every layer's attention takes of the positions (gemma.py: two sets)."""
        return self.rope.tables(positions, dtype)

    def reset_rope_tables(self, device: torch.device, **kwargs) -> None:
        """(Re)compute every RotaryEmbedding's tables (after building on 'meta')."""
        for module in self.modules():
            if isinstance(module, RotaryEmbedding):
                module.reset_tables(device, **kwargs)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The input embeddings of `ids` (Granite's scaled by its embedding multiplier)."""
        x = self.embed_tokens(ids)
        m = self.args.embedding_multiplier
        return x if m == 1.0 else x * m

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits of final normed hidden rows (Granite's divided by logits_scaling)."""
        out = self.lm_head(h)
        s = self.args.logits_scaling
        return (out if s == 1.0 else out / s).float()

    def bind_row_kernels(self, kernels: RowKernels | None) -> None:
        """Run the norms, rope and SiLU of every layer through `kernels` (None: torch ops)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, FeedForward)):
                module.rows = kernels

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *,
                     need_lm_head: bool = True) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up. Raises on missing or extra names
        (`need_lm_head` False: an embedding model's checkpoint may have no head)."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in _per_expert(weights):
            name, shard = _map_hf_name(hf_name)
            if name is None or "rotary_emb" in hf_name:
                continue
            if name == "lm_head.weight" and self.args.tie_word_embeddings:
                continue
            if name not in params:
                raise ValueError(f"unexpected weight {hf_name!r} in checkpoint")
            param = params[name]
            if shard is None:
                if param.shape != tensor.shape:
                    raise ValueError(f"weight {hf_name!r} has shape {tuple(tensor.shape)}, "
                                     f"expected {tuple(param.shape)}")
                param.data.copy_(tensor)
                # a fused tensor of the checkpoint (Phi-3's qkv_proj, gate_up_proj) is its parts
                parts = _fused_parts(name)
                loaded.update([f"{name}#{p}" for p in parts] if parts else [name])
            else:
                start, size = self._shard_range(param, shard)
                param.data[start:start + size].copy_(tensor)
                loaded.add(f"{name}#{shard}")
        if self.args.tie_word_embeddings:
            if isinstance(self.lm_head, nn.Linear):  # (tiled layers share their tiles)
                self.lm_head.weight = self.embed_tokens.weight
            loaded.add("lm_head.weight")
        missing = [n for n in self._expected_loaded_names() if n not in loaded
                   and (need_lm_head or n != "lm_head.weight")]
        if missing:
            raise ValueError(f"checkpoint is missing weights: {missing[:5]}"
                             f"{' ...' if len(missing) > 5 else ''}")

    def _shard_range(self, param: torch.Tensor, shard: str) -> tuple[int, int]:
        """The rows of fused `param` that checkpoint part `shard` fills."""
        a = self.args
        q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        half = param.shape[0] // 2  # gate_up of a dense MLP or of an expert
        ranges = {"q": (0, q), "k": (q, kv), "v": (q + kv, kv),
                  "gate": (0, half), "up": (half, half)}
        return ranges[shard]

    def _expected_loaded_names(self) -> list[str]:
        names = []
        for name, _ in self.named_parameters():
            parts = _fused_parts(name)
            names += [f"{name}#{p}" for p in parts] if parts else [name]
        return names


def _fused_parts(name: str) -> tuple[str, ...]:
    """The checkpoint tensors fused into our parameter `name` (empty: not fused)."""
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
    return {"qkv_proj": ("q", "k", "v"), "gate_up_proj": ("gate", "up")}.get(module, ())


_SHARDS = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}


# Mixtral's checkpoint names: block_sparse_moe.experts.E.w1/w3/w2 are gate/up/down
_MIXTRAL = {"block_sparse_moe": "mlp", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def _per_expert(weights: Iterable[tuple[str, torch.Tensor]]
                ) -> Iterable[tuple[str, torch.Tensor]]:
    """Checkpoints that stack the experts (transformers >= 5's in-memory layout,
    mlp.experts.gate_up_proj [experts, 2 * inter, hidden] and mlp.experts.down_proj) as the
    per-expert tensors the model holds."""
    for name, tensor in weights:
        stem, _, last = name.rpartition(".")
        if stem.endswith(".experts") and last in ("gate_up_proj", "down_proj"):
            for e, part in enumerate(tensor.unbind(0)):
                yield f"{stem}.{e}.{last}.weight", part
        else:
            yield name, tensor


def _map_hf_name(hf_name: str) -> tuple[str | None, str | None]:
    """'model.layers.3.self_attn.q_proj.weight' -> ('layers.3.self_attn.qkv_proj.weight', 'q')."""
    name = hf_name.removeprefix("model.")
    parts = name.split(".")
    if "block_sparse_moe" in parts:
        parts = [_MIXTRAL.get(p, p) for p in parts]
        name = ".".join(parts)
    for i, part in enumerate(parts):
        if part in _SHARDS:
            fused, shard = _SHARDS[part]
            parts[i] = fused
            return ".".join(parts), shard
    return name, None
