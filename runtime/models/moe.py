"""Mixture-of-experts MLPs (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE) on the Llama blocks.

A router (a linear to num_experts logits, softmax in fp32, top_k, renormalised where the
config says so) picks each token's experts; each expert is a SiLU-gated MLP of its own, an
ordinary FeedForward, so quantization, oneDNN packing and the C kernels' tiling treat it as
any other pair of linears. The tokens are grouped by expert and each expert that has tokens
runs one product over its rows: only the routed experts' weights are read. On a GPU the
experts' dense weights are viewed as stacked [experts, ...] tensors and run through
kernels/moe.py's grouped-expert kernel in two launches instead of one per expert.

Qwen2-MoE adds a shared expert that every token runs, scaled by sigmoid(shared_expert_gate).

Under tensor parallelism (runtime/distributed/tp_model.py) a rank holds experts
first_expert .. first_expert + len(experts) - 1 of them all and the router whole: it routes
every token, runs the pairs of its own experts, and the ranks' outputs are summed.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelArgs
from .feed_forward import FeedForward


class Router(nn.Linear):
    """A router or a shared expert's gate: a linear that quantization and packing leave dense
    (they take exact `nn.Linear`s only): a 4-bit router would pick other experts."""


class SparseMoe(nn.Module):
    def __init__(self, args: ModelArgs, experts: tuple[int, int] | None = None):
        """`experts`: (first, count) of the experts this module holds (a TP rank's); all
        by default."""
        super().__init__()
        self.num_experts, self.top_k = args.num_experts, args.num_experts_per_tok
        self.norm_topk_prob = args.norm_topk_prob
        self.first_expert, count = experts or (0, args.num_experts)
        self.gate = Router(args.hidden_size, args.num_experts, bias=False)
        self.experts = nn.ModuleList(
            FeedForward(args, intermediate_size=args.moe_intermediate_size, bias=False)
            for _ in range(count))
        shared = args.shared_expert_intermediate_size
        self.shared_expert = (FeedForward(args, intermediate_size=shared, bias=False)
                              if shared else None)
        self.shared_expert_gate = Router(args.hidden_size, 1, bias=False) if shared else None
        self._stacked: tuple[torch.Tensor, torch.Tensor] | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [tokens, hidden] -> (weights [tokens, top_k] fp32, expert ids [tokens, top_k])."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        stacked = self.stacked_weights() if x.is_cuda else None
        if stacked is not None:
            from radixflow.kernels.moe import moe_experts

            out = moe_experts(x, *stacked, ids, weights)
        else:
            out = self.grouped_experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def grouped_experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                        ) -> torch.Tensor:
        """sum_j weights[t, j] * expert_{ids[t, j]}(x_t): the (token, choice) pairs sorted by
        expert, one call of each expert that has pairs over its rows."""
        out = torch.zeros_like(x)
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        pair_weights = weights.flatten()
        start = sum(counts[:self.first_expert])
        for expert, n in enumerate(counts[self.first_expert:][:len(self.experts)]):
            if n == 0:
                continue
            pairs = order[start:start + n]
            start += n
            tokens = pairs // self.top_k
            h = self.experts[expert](x.index_select(0, tokens))
            out.index_add_(0, tokens, (h * pair_weights[pairs, None].to(h.dtype)).to(out.dtype))
        return out

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """([experts, 2 * inter, hidden], [experts, hidden, inter]) when every expert is a
        dense nn.Linear pair: the first call moves their weights into two stacked tensors and
        leaves each expert's weights as views of them (no second copy). None otherwise."""
        if self._stacked is not None:
            return self._stacked
        if len(self.experts) != self.num_experts:
            return None  # (a TP rank's share: the kernel takes global expert ids)
        linears = [(e.gate_up_proj, e.down_proj) for e in self.experts]
        if not all(type(a) is nn.Linear and type(b) is nn.Linear for a, b in linears):
            return None
        stacked = tuple(torch.stack([pair[i].weight.detach() for pair in linears])
                        for i in (0, 1))
        for e, (gate_up, down) in enumerate(linears):
            gate_up.weight = nn.Parameter(stacked[0][e], requires_grad=False)
            down.weight = nn.Parameter(stacked[1][e], requires_grad=False)
        self._stacked = stacked
        return stacked
