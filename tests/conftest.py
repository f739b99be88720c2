"""Shared fixtures. Tiny random models are built per test session; the default model is
fetched (once, then cached) only by tests marked e2e."""

from __future__ import annotations

import os

import pytest

# Two test workers share two cores: OpenMP threads that spin while waiting for work take a core
# the other worker's test needs (a fifth of the suite's CPU time). Before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import radixflow  # noqa: F401  (first: it puts the checkout's root behind PyPI's `kernels`)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Without a GPU, Triton kernels run under the interpreter. triton decides that when a kernel is
# decorated, so it is set here, before any test module can import radixflow.kernels.triton
# (tests/kernels, tests/bench/test_gpu_check.py); a GPU run compiles the kernels for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `server`, `tiny_model_dir`, `tokenizer`, `client`: one live server for tests/runtime/server,
# tests/runtime/router and tests/bench.
pytest_plugins = ["helpers.server_fixtures"]


@pytest.fixture(scope="session")
def default_model_path():
    from radixflow.runtime.model_loader import resolve_model

    return resolve_model(None)


def _kernel_levels() -> list:
    """Each C-kernel level this machine runs (best first), as pytest params; a level the CPU
    lacks is a skipped param that names it."""
    from radixflow.kernels.cpu.features import REQUIRED, supported_levels

    here = supported_levels()
    return [pytest.param(level, marks=pytest.mark.skipif(
                level not in here, reason=f"needs a CPU with {', '.join(REQUIRED[level])}"))
            for level in ("avx512", "avx2")]


@pytest.fixture(params=_kernel_levels())
def cpu_level(request):
    """Runs the test with the CPU kernels forced to each level the machine supports (an AVX-512
    machine tests its AVX2 build too)."""
    from radixflow.kernels.cpu import features

    features.set_level(request.param)
    try:
        yield request.param
    finally:
        features.set_level("auto")
