"""Grammar bitmask apply: disallowed logits become -inf, in place.

The bitmask is xgrammar's: int32 [bs, ceil(vocab / 32)], bit j of word w allows token
32 * w + j. For every row i in `row_indices` (every row when None) and every column j of
`logits`:

    if j >= 32 * bitmask.shape[1] or not (bitmask[i, j // 32] >> (j % 32)) & 1:
        logits[i, j] = -inf

Columns past the bitmask (a model vocab padded beyond the tokenizer's) count as disallowed.
Rows not in `row_indices` (requests without a constraint) are untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from .dispatch import require_triton

BitmaskBackend = Literal["auto", "torch", "triton"]
_XGRAMMAR_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def apply_bitmask_(
    logits: torch.Tensor,  # [bs, vocab] float
    bitmask: torch.Tensor,  # [bs, ceil(vocab / 32)] int32
    row_indices: Sequence[int] | torch.Tensor | None = None,
    *,
    backend: BitmaskBackend = "auto",
) -> None:
    """Set logits[i, j] to -inf where token j is disallowed for row i, for i in row_indices.

    auto: Triton on CUDA; on CPU xgrammar's C++ kernel (the torch reference where xgrammar
    cannot do it).

    Raises
    ------
    ValueError: shapes, dtypes or devices that do not fit together.
    """
    _check(logits, bitmask)
    if row_indices is not None and len(row_indices) == 0:
        return
    if backend == "auto":
        backend = "triton" if logits.is_cuda else "torch"
    if backend == "torch":
        if _xgrammar_can(logits):
            return _apply_bitmask_xgrammar(logits, bitmask, row_indices)
        return apply_bitmask_torch_(logits, bitmask, row_indices)
    if backend == "triton":
        require_triton(logits)
        from .triton.bitmask import apply_bitmask_triton

        return apply_bitmask_triton(logits, bitmask, _as_index_tensor(row_indices, logits))
    raise ValueError(f"unknown bitmask backend {backend!r}; expected auto, torch or triton")


def apply_bitmask_torch_(logits: torch.Tensor, bitmask: torch.Tensor,
                         row_indices: Sequence[int] | torch.Tensor | None = None) -> None:
    """The reference: unpack the bits with torch ops and mask_fill the listed rows."""
    rows = _as_index_tensor(row_indices, logits)
    vocab = logits.shape[1]
    words = bitmask.shape[1]
    selected = bitmask if rows is None else bitmask[rows]  # [n, words]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((selected.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)  # [n, 32 * words]
    if 32 * words >= vocab:
        allowed = allowed[:, :vocab]
    else:
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab - 32 * words)], 1)
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def _apply_bitmask_xgrammar(logits: torch.Tensor, bitmask: torch.Tensor,
                            row_indices: Sequence[int] | torch.Tensor | None) -> None:
    import xgrammar

    vocab = logits.shape[1]
    covered = min(vocab, 32 * bitmask.shape[1])
    indices = None
    if row_indices is not None:
        indices = (row_indices.tolist() if isinstance(row_indices, torch.Tensor)
                   else [int(i) for i in row_indices])
    xgrammar.apply_token_bitmask_inplace(logits, bitmask, vocab_size=covered, indices=indices,
                                         backend="cpu")
    if covered < vocab:  # xgrammar leaves columns past the bitmask alone; we disallow them
        if indices is None:
            logits[:, covered:] = float("-inf")
        else:
            logits[indices, covered:] = float("-inf")


def _xgrammar_can(logits: torch.Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype in _XGRAMMAR_CPU_DTYPES


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2:
        raise ValueError(f"logits and bitmask must be 2-D, got {tuple(logits.shape)} and "
                         f"{tuple(bitmask.shape)}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {logits.shape[0]}")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask on {bitmask.device}, logits on {logits.device}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")


def _as_index_tensor(row_indices: Sequence[int] | torch.Tensor | None,
                     like: torch.Tensor) -> torch.Tensor | None:
    if row_indices is None:
        return None
    if isinstance(row_indices, torch.Tensor):
        return row_indices.to(device=like.device, dtype=torch.int64)
    return torch.tensor(list(row_indices), dtype=torch.int64, device=like.device)
