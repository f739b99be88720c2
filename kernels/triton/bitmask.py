"""Triton grammar-bitmask apply (semantics: kernels/bitmask.py).

Program (row, block) reads BLOCK_W bitmask words and writes -inf into the disallowed logits of
those 32 * BLOCK_W columns; allowed logits are neither read nor written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(
    Logits, Bitmask, Rows, vocab, num_words, stride_l, stride_b,
    HAS_ROWS: tl.constexpr,
    BLOCK_W: tl.constexpr,  # bitmask words per program
):
    if HAS_ROWS:
        row = tl.load(Rows + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    offs_w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    words = tl.load(Bitmask + row * stride_b + offs_w, mask=offs_w < num_words, other=0)
    bits = tl.arange(0, 32)
    cols = offs_w[:, None] * 32 + bits[None, :]  # [BLOCK_W, 32]
    disallowed = ((words[:, None] >> bits[None, :]) & 1) == 0
    neg_inf = tl.full([BLOCK_W, 32], float("-inf"), dtype=Logits.dtype.element_ty)
    tl.store(Logits + row * stride_l + cols, neg_inf, mask=disallowed & (cols < vocab))


def apply_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor,
                         rows: torch.Tensor | None) -> None:
    num_rows = logits.shape[0] if rows is None else rows.shape[0]
    vocab = logits.shape[1]
    if num_rows == 0 or vocab == 0:
        return
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("the Triton bitmask kernel needs unit stride along the vocab")
    block_w = 32 if logits.is_cuda else 64
    # Columns past the bitmask read words as 0, so the grid covers the whole vocab.
    grid = (num_rows, triton.cdiv(triton.cdiv(vocab, 32), block_w))
    _apply_bitmask_kernel[grid](
        logits, bitmask, rows if rows is not None else bitmask, vocab, bitmask.shape[1],
        logits.stride(0), bitmask.stride(0),
        HAS_ROWS=rows is not None,
        BLOCK_W=block_w,
        num_warps=4,
    )
