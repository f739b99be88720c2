"""Choosing a kernel backend: Triton on CUDA, torch elsewhere; triton imported only when used."""

from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["auto", "torch", "triton"]


def pick_backend(backend: Backend, x: torch.Tensor) -> str:
    """'torch' or 'triton' for a kernel whose main input is x."""
    if backend == "auto":
        return "triton" if x.is_cuda else "torch"
    if backend == "triton":
        require_triton(x)
        return "triton"
    if backend == "torch":
        return "torch"
    raise ValueError(f"unknown kernel backend {backend!r}; expected auto, torch or triton")


def require_triton(x: torch.Tensor) -> None:
    """Raise a clear error where a Triton kernel cannot run on x's device."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError("the triton backend needs the `triton` package "
                           "(pip install 'radixflow[triton]')") from e
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton kernels run on CPU tensors only under the interpreter: "
                           "set TRITON_INTERPRET=1 before radixflow's kernels are first used")
