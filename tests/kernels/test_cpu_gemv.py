"""The AVX-512 Q8_0 matrix-vector kernel (kernels/cpu) against its torch reference."""

from __future__ import annotations

import pytest
import torch
from radixflow.kernels import cpu

needs_kernels = pytest.mark.skipif(not cpu.available(), reason="no AVX-512 CPU kernels here")


def test_q8_0_quantization_is_exact_on_8bit_groups():
    torch.manual_seed(1)
    q = torch.randint(-127, 128, (5, 64)).float()
    q[:, ::32] = -127
    scale = torch.rand(5, 2) * 0.01 + 1e-3
    dense = q * scale.repeat_interleave(32, 1)
    w = cpu.quantize_q8_0(dense)
    assert w.q.dtype == torch.int8 and w.scale.shape == (5, 2)
    torch.testing.assert_close(cpu.unpack_q8_0(w), dense, atol=0, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize(("n", "k", "m"), [(1, 32, 1), (5, 64, 2), (49, 576, 1), (200, 1536, 4),
                                           (3, 96, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q8_0_gemv_matches_reference(n, k, m, dtype):
    torch.manual_seed(n + k + m)
    w = cpu.quantize_q8_0(torch.randn(n, k))
    x = torch.randn(m, k).to(dtype)
    ref = x.float() @ cpu.unpack_q8_0(w).T
    torch.testing.assert_close(cpu.q8_0_gemv(x, w), ref, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(cpu.q8_0_reference(x, w), ref, atol=1e-4, rtol=1e-5)


def test_without_the_library_the_reference_answers(monkeypatch):
    torch.manual_seed(2)
    monkeypatch.setattr(cpu, "_library", lambda: None)
    w = cpu.quantize_q8_0(torch.randn(6, 64))
    x = torch.randn(2, 64)
    torch.testing.assert_close(cpu.q8_0_gemv(x, w), x @ cpu.unpack_q8_0(w).T)


def test_bad_input_shape_is_named():
    w = cpu.quantize_q8_0(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"expected x of shape \[M, 64\]"):
        cpu.q8_0_gemv(torch.randn(1, 32), w)


def test_compile_failure_turns_the_kernels_off(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    cpu._library.cache_clear()
    try:
        assert not cpu.available()
    finally:
        cpu._library.cache_clear()
