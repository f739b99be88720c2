"""Kernels: Triton on CUDA (and on the CPU under TRITON_INTERPRET=1), torch references
everywhere. Importing this package does not import triton; each dispatcher imports its Triton
module the first time it runs it."""

from __future__ import annotations

from .attention import decode_attention, extend_attention
from .bitmask import apply_bitmask_
from .sampling import sample_from_logits

__all__ = ["apply_bitmask_", "decode_attention", "extend_attention", "sample_from_logits"]
