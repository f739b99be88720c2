"""The per-token vector work of an extend forward in one pass each (rows.c): residual add +
RMSNorm, rope, SiLU(gate) * up, on the rows of a bf16 or fp32 model, rounded as the torch ops
round (so a forward through them computes what the torch model computes; see rows.c).

The model binds a `RowKernels` at load (LlamaForCausalLM.bind_row_kernels); each method takes
its tensors or answers None, and the caller then runs its torch ops (a layout or dtype the
kernels do not take, or inside torch.compile, which cannot trace a C call). `reference_*` are
the torch computations the tests compare against.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from . import _library

_DTYPES = (torch.bfloat16, torch.float32)


def _rows_of(x: torch.Tensor, n: int) -> int:
    return x.numel() // n if n else 0


class RowKernels:
    """The row kernels of one CPU level's build, bound once (ctypes signatures set)."""

    def __init__(self, level: str | None = None):
        lib = _library(level)
        if lib is None:
            raise RuntimeError(f"no CPU kernels for level {level or 'in force'}")
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._norm = lib.rf_rows_add_rms_norm
        self._norm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, i64, i64]
        self._rope = lib.rf_rows_rope
        self._rope.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, i64, i64]
        self._silu = lib.rf_rows_silu_mul
        self._silu.argtypes = [ptr, ptr, i64, i64, i64, i64]
        for fn in (self._norm, self._rope, self._silu):
            fn.restype = None
        self.max_head_dim = lib.rf_limits.max_head_dim

    @staticmethod
    def _takes(x: torch.Tensor, *same: torch.Tensor) -> bool:
        return (not torch.compiler.is_compiling()  # (a C call is not traceable)
                and x.device.type == "cpu" and x.dtype in _DTYPES and not x.requires_grad
                and all(t.dtype == x.dtype and t.device == x.device and t.is_contiguous()
                        for t in same))

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor | None:
        """x += delta in place (unless None), then RMSNorm(x) * weight over the last dim."""
        others = (x, weight) if delta is None else (x, weight, delta)
        if not self._takes(x, *others) or (delta is not None and delta.shape != x.shape):
            return None
        n = x.shape[-1]
        if weight.numel() != n:
            return None
        out = torch.empty_like(x)
        self._norm(x.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                   out.data_ptr(), _rows_of(x, n), n, eps, x.dtype == torch.bfloat16,
                   torch.get_num_threads())
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> bool:
        """Rotate x [tokens, heads, head_dim] in place (rope.py's apply_rope); x's heads of a
        token must be contiguous, its tokens any stride apart. False: not taken."""
        if x.dim() != 3 or not self._takes(x, cos, signed_sin):
            return False
        tokens, heads, dim = x.shape
        if (x.stride(2) != 1 or x.stride(1) != dim or dim > self.max_head_dim or dim % 2
                or cos.numel() != tokens * dim or signed_sin.numel() != tokens * dim):
            return False
        self._rope(x.data_ptr(), tokens, heads, x.stride(0), dim, cos.data_ptr(),
                   signed_sin.data_ptr(), x.dtype == torch.bfloat16, torch.get_num_threads())
        return True

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of gate_up [..., 2n] (gate first): [..., n]."""
        if not self._takes(gate_up, gate_up) or gate_up.shape[-1] % 2:
            return None
        n = gate_up.shape[-1] // 2
        out = gate_up.new_empty(*gate_up.shape[:-1], n)
        self._silu(gate_up.data_ptr(), out.data_ptr(), _rows_of(gate_up, 2 * n), n,
                   gate_up.dtype == torch.bfloat16, torch.get_num_threads())
        return out


def reference_add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, its RMSNorm): the torch model's ops (llama.py's RMSNorm)."""
    if delta is not None:
        x = x + delta
    return x, F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype) * weight


def reference_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
