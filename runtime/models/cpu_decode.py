"""Decode steps through radixflow's C decode kernel (kernels/cpu/decode.c).

Decoding on a CPU at small batch sizes is the latency case: each token is ~30 layers of a
dozen small operations, and as torch calls their dispatch costs as much as the arithmetic. The
C step runs the whole step (all layers, attention over the KV pool in place, the head) for up
to `max_batch` requests, one token each, in one call, with the weights in the tiled layouts of
kernels/cpu/gemv_*.c exactly as the model holds them (Q4_1 / Q8_0 groups from the GGUF, or bf16).

It covers a model on a CPU at level avx512 or avx2 (kernels/cpu/features.py) whose layers are
quantized (Int4Linear, as `--quantization auto` makes the default model's) over a bf16 KV pool,
mixture-of-experts layers (moe.py's SparseMoe) included: the step routes each row, groups the
rows by expert and reads only the routed experts' weights. Sliding-window layers attend each
row's last `window` keys (Attention.window), as the torch backends do.
Jump-forward's forced tokens are rows of the same call (they skip the head); larger batches,
prefill and anything else run the torch model.
"""

from __future__ import annotations

import logging

import torch

from radixflow.kernels import cpu as cpu_kernels
from radixflow.kernels.cpu import decode as cpu_decode

from ..forward_batch import BatchRequest
from ..memory_pool import KVPool
from .feed_forward import FeedForward
from .llama import LlamaForCausalLM, RMSNorm
from .moe import SparseMoe
from .quant_linear import QuantLinear, StackedLinear

logger = logging.getLogger(__name__)


def _tiled(linear: torch.nn.Module) -> cpu_kernels.TiledWeight | cpu_decode.Parts | None:
    if isinstance(linear, StackedLinear):
        return None if cpu_decode.check_parts(linear.tiled_parts) else linear.tiled_parts
    return linear.tiled if isinstance(linear, QuantLinear) else None


def _fp32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float().contiguous()


def _norm(norm: RMSNorm | None) -> torch.Tensor | None:
    return None if norm is None else _fp32(norm.weight)


_NOT_TILED = "its layers are not in the tiled 4-bit format (--quantization auto|int4)"


def _mlp(mlp: FeedForward) -> tuple[cpu_kernels.TiledWeight | None, cpu_kernels.TiledWeight | None]:
    return _tiled(mlp.gate_up_proj), _tiled(mlp.down_proj)


def _moe(mlp: SparseMoe) -> tuple[cpu_decode.MoeWeights | None, str]:
    """A SparseMoe as the C step's MoeWeights, or (None, why not)."""
    if len(mlp.experts) != mlp.num_experts:
        return None, "a share of the experts (tensor parallelism)"
    experts = [_mlp(e) for e in mlp.experts]
    shared = _mlp(mlp.shared_expert) if mlp.shared_expert is not None else (None, None)
    if any(w is None for pair in experts for w in pair) or (
            mlp.shared_expert is not None and None in shared):
        return None, _NOT_TILED
    return cpu_decode.MoeWeights(
        _fp32(mlp.gate.weight), [gu for gu, _ in experts], [d for _, d in experts], mlp.top_k,
        mlp.norm_topk_prob,
        shared_gate=None if mlp.shared_expert_gate is None else _fp32(
            mlp.shared_expert_gate.weight).view(-1),
        shared_gate_up=shared[0], shared_down=shared[1]), ""


class CpuDecode:
    """`run` one decode step; `build` says whether it can run for a model."""

    def __init__(self, model: LlamaForCausalLM, step: cpu_decode.DecodeStep):
        self.model = model
        self.step = step
        self.calls = 0

    @classmethod
    def build(cls, model: LlamaForCausalLM, kv_pool: KVPool, scale: float, max_context: int
              ) -> tuple[CpuDecode | None, str]:
        """(CpuDecode, "") or (None, why not)."""
        if not cpu_kernels.available():
            return None, ("radixflow's CPU kernels do not run here (they need level avx512 or "
                          "avx2 and a C compiler)")
        if kv_pool.k[0].device.type != "cpu" or kv_pool.k[0].dtype not in (torch.bfloat16,
                                                                             torch.int8):
            return None, "it reads a bf16 or int8 KV cache on the CPU"
        a = model.args
        if gaps := a.fused_decode_gaps():
            return None, f"{a.architecture}'s {', '.join(gaps)}"
        shape = cpu_decode.ModelShape(a.hidden_size, a.num_heads, a.num_kv_heads, a.head_dim,
                                      a.intermediate_size, a.vocab_size, a.rms_norm_eps, scale)
        reason = cpu_decode.check_shape(shape, cpu_kernels.limits())
        if reason:
            return None, reason
        layers = []
        for i, block in enumerate(model.layers):
            attn, mlp = block.self_attn, block.mlp
            moe = None
            if isinstance(mlp, SparseMoe):
                moe, why = _moe(mlp)
                if moe is None:
                    return None, why
                if why := moe.check(a.hidden_size):
                    return None, f"its experts' {why}"
                dense = (None, None)
            else:
                dense = _mlp(mlp)
            weights = [_tiled(attn.qkv_proj), _tiled(attn.o_proj), *dense]
            if any(w is None for w in weights[:2]) or (moe is None and None in dense):
                return None, _NOT_TILED
            bias = attn.qkv_proj.bias
            layers.append(cpu_decode.LayerWeights(
                _norm(block.input_layernorm), _norm(block.post_attention_layernorm),
                _norm(attn.q_norm), _norm(attn.k_norm), _fp32(bias), *weights,
                kv_pool.k[i], kv_pool.v[i], moe=moe, window=attn.window or 0,
                k_scales=kv_pool.k_scales[i] if kv_pool.is_int8 else None,
                v_scales=kv_pool.v_scales[i] if kv_pool.is_int8 else None,
                k_offset=kv_pool.k_offsets[i] if kv_pool.is_int8 else None))
        head = _tiled(model.lm_head)
        if head is None:
            return None, "its output head has no tiled weights"
        step = cpu_decode.DecodeStep(shape, layers, _norm(model.norm), head, max_context,
                                     torch.get_num_threads(),
                                     bf16_inputs=model.norm.weight.dtype == torch.bfloat16)
        return cls(model, step), ""

    @property
    def max_batch(self) -> int:
        return self.step.max_batch

    def accepts(self, parts: list[BatchRequest]) -> bool:
        """A decode pass the C step runs: one token a row (jump-forward's forced tokens are
        rows of their own), at most `max_batch` rows, logits wanted of a row's token or not."""
        return len(parts) <= self.max_batch and all(
            len(p.ids) == 1 and p.logit_offsets in ([0], []) for p in parts)

    @torch.inference_mode()
    def run(self, parts: list[BatchRequest], out_slots: torch.Tensor,
            req_to_token: torch.Tensor) -> torch.Tensor:
        """Logits (float32, [rows that want them, vocab], in part order) after each part's
        token; their K/V go to out_slots (int64, one per part). req_to_token: the request ->
        KV slot table (int32), whose row part.req_pool_idx already holds the part's slot at
        part.start_pos."""
        self.calls += 1
        wanted = [p.logit_offsets == [0] for p in parts]
        if not all(wanted):  # rows the sampler skips go last, where the head skips them
            order = [i for i, w in enumerate(wanted) if w] + [i for i, w in enumerate(wanted)
                                                             if not w]
            parts = [parts[i] for i in order]
            out_slots = out_slots[order]
        model = self.model
        ids = torch.tensor([p.ids[0] for p in parts], dtype=torch.int64)
        pos = torch.tensor([p.start_pos for p in parts], dtype=torch.int64)
        x = model.embed(ids).float()  # (Granite's embedding multiplier in the model dtype)
        cos, sin = model.rope.cos.index_select(0, pos), model.rope.sin.index_select(0, pos)
        rows = [p.req_pool_idx for p in parts]
        with cpu_kernels.batch_int8_by_requests(len(set(rows)), len(rows)):
            logits = self.step(x, cos, sin, out_slots.to(torch.int64).contiguous(),
                               req_to_token, torch.tensor(rows, dtype=torch.int64), pos + 1,
                               logit_rows=sum(wanted))
        scaling = model.args.logits_scaling
        return logits if scaling == 1.0 else logits / scaling
