"""Attention backends: torch_native (CPU, and a reference everywhere) and triton (CUDA)."""

from __future__ import annotations

import torch

from ..forward_batch import AttentionBackend


def create_attention_backend(name: str, device: torch.device, num_heads: int, num_kv_heads: int,
                             head_dim: int, scale: float,
                             dtype: torch.dtype | None = None) -> AttentionBackend:
    """dtype: the model's (its queries'); lets torch_native pick radixflow's prefill attention
    kernel on CPUs whose kernels take that dtype."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch_native"
    if name == "torch_native":
        from .torch_native import TorchNativeAttnBackend

        return TorchNativeAttnBackend(num_heads, num_kv_heads, head_dim, scale,
                                      cpu_dtype=dtype if device.type == "cpu" else None)
    if name == "triton":
        from .triton_backend import TritonAttnBackend

        return TritonAttnBackend(num_heads, num_kv_heads, head_dim, scale)
    raise ValueError(f"--attention-backend must be auto, torch_native or triton, got {name!r}")
