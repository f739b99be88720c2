"""Attention backends: torch_native (CPU, and a reference everywhere) and triton (CUDA)."""

from __future__ import annotations

import torch

from ..forward_batch import AttentionBackend
from ..memory_pool import KVPool


def check_backend_fits_device(name: str, device: torch.device) -> None:
    """Refuse, at start-up, a backend that cannot run on the device (instead of failing at the
    first forward)."""
    if name == "torch_native" and device.type == "cuda":
        raise ValueError("--attention-backend torch_native runs on the CPU only (it calls "
                         "torch's CPU flash-attention kernels); on a CUDA device pass "
                         "--attention-backend triton or auto, or --device cpu")


def create_attention_backend(name: str, device: torch.device, num_heads: int, num_kv_heads: int,
                             head_dim: int, scale: float,
                             dtype: torch.dtype | None = None,
                             windowed: bool = False) -> AttentionBackend:
    """dtype: the model's (its queries'); lets torch_native pick radixflow's prefill attention
    kernel on CPUs whose kernels take that dtype. windowed: some layer attends through a
    sliding window (triton compiles its windowed kernels at warm-up too)."""
    check_backend_fits_device(name, device)
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch_native"
    if name == "torch_native":
        from .torch_native import TorchNativeAttnBackend

        return TorchNativeAttnBackend(num_heads, num_kv_heads, head_dim, scale,
                                      cpu_dtype=dtype if device.type == "cpu" else None)
    if name == "triton":
        from .triton_backend import TritonAttnBackend

        return TritonAttnBackend(num_heads, num_kv_heads, head_dim, scale, windowed=windowed,
                                 dtype=dtype)
    raise ValueError(f"--attention-backend must be auto, torch_native or triton, got {name!r}")


def warm_up_attention(backend: AttentionBackend, kv_pool: KVPool,
                      req_to_token: torch.Tensor) -> None:
    """Compile, before the first request, every kernel variant the backend can launch over
    these pools (Triton on CUDA); nothing for backends with nothing to compile."""
    if kv_pool.device.type != "cuda":
        return
    from .triton_backend import TritonAttnBackend

    if isinstance(backend, TritonAttnBackend):
        backend.warm_up(kv_pool, req_to_token)
