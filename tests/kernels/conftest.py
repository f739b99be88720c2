"""Kernel tests run the Triton kernels for real on a CUDA machine, and on the CPU through the
interpreter elsewhere (tests/conftest.py sets TRITON_INTERPRET=1 when there is no GPU):
`kernel_device` is the device their inputs go to."""

from __future__ import annotations

import pytest
import torch

ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """Where a Triton kernel under test runs: the GPU when there is one, else the CPU."""
    return torch.device("cuda" if ON_GPU else "cpu")
