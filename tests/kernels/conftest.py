"""Kernel tests run the Triton kernels for real on a CUDA machine, and on the CPU through the
interpreter elsewhere: `kernel_device` is the device their inputs go to.

NOTE: triton decides at @triton.jit time whether a kernel is interpreted, so the variable must
be set before any radixflow.kernels.triton module is imported.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Where a Triton kernel under test runs: the GPU when there is one, else the CPU."""
    return torch.device("cuda" if ON_GPU else "cpu")
