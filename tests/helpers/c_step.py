"""What the C decode step's tests share: an fp32 model holding exactly the weights a quantized
model holds (the reference the C step and the eager step are measured against), and logits
teacher-forced through one-token decode steps, one request or several side by side."""

from __future__ import annotations

import torch

from radixflow.kernels import cpu
from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

DENSE = ("norm", "embed")  # parameter names a quantized model keeps as they are


def hold_the_same_weights(src: torch.nn.Module, dst: torch.nn.Module,
                          dense: tuple[str, ...] = DENSE) -> None:
    """Give `dst` (an fp32 model of the same shape) the weights `src` holds: the parameters
    whose names contain one of `dense` (or end with one, for names like a router's) as fp32,
    every tiled linear (head included) unpacked."""
    for name, param in src.named_parameters():
        if any(part in name for part in dense):
            dst.get_parameter(name).data = param.detach().float()
    for name, module in src.named_modules():
        if getattr(module, "tiled", None) is not None:
            target = dst.get_submodule(name)
            target.weight.data = cpu.unpack(module.tiled)
            if module.bias is not None:
                target.bias.data = module.bias.float()


def teacher_forced_batch(runner, seqs: list[list[int]], first_row: int = 0
                         ) -> list[torch.Tensor]:
    """Every request's logits after each of its tokens, the requests decoding side by side: a
    step holds one token of each request not yet done (so the batch shrinks)."""
    slots = [runner.kv_pool.alloc(len(seq)) for seq in seqs]
    table = runner.req_to_token_pool.req_to_token
    for row, (seq, s) in enumerate(zip(seqs, slots, strict=True)):
        table[first_row + row, :len(seq)] = s.to(torch.int32)
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    for i in range(max(map(len, seqs))):
        live = [r for r, seq in enumerate(seqs) if i < len(seq)]
        parts = [BatchRequest(req_pool_idx=first_row + r, ids=[seqs[r][i]], start_pos=i,
                              logit_offsets=[0]) for r in live]
        logits = runner.forward(ForwardMode.DECODE, parts,
                                torch.cat([slots[r][i:i + 1] for r in live]))
        for j, r in enumerate(live):
            out[r].append(logits[j:j + 1])
    for s in slots:
        runner.kv_pool.free(s)
    return [torch.cat(o) for o in out]


def teacher_forced(runner, tokens: list[int], row: int) -> torch.Tensor:
    """Logits after each token, every token fed as a one-token decode step."""
    return teacher_forced_batch(runner, [tokens], first_row=row)[0]
