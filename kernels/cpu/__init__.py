"""AVX-512 matrix-vector products over GGUF-style Q4_1 / Q8_0 weights, for CPU decode.

gemv.c is compiled once per machine with the system C compiler into the radixflow cache
folder and loaded with ctypes (no torch headers: it builds in about a second). Where there is
no AVX-512 or no compiler, `available()` is False and callers keep their torch path.

Each kernel has a torch reference (`*_reference`) that the tests compare against.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("gemv.c")
GROUP = 32
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma", "-fopenmp",
         "-shared", "-fPIC"]


def _cache_dir() -> Path:
    """Same rule as the model cache: $RADIXFLOW_CACHE, else $XDG_CACHE_HOME/radixflow, else ~/.cache."""
    env = os.environ.get("RADIXFLOW_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else None
    return (base or Path.home() / ".cache") / "radixflow"


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_has_avx512() -> bool:
    return all(f in _cpu_flags() for f in ("avx512f", "avx512bw", "avx512vl"))


@functools.cache
def has_vnni() -> bool:
    """Whether q4_1_q8_gemv (AVX512-VNNI) can run here."""
    return available() and "avx512_vnni" in _cpu_flags()


def _compile(dest: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) found")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(out)],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(out, dest)  # atomic: a concurrent process sees the whole library or none


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get("RADIXFLOW_DISABLE_CPU_KERNELS"):
        return None
    if not _cpu_has_avx512():
        logger.info("CPU kernels off: this CPU has no AVX-512")
        return None
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    path = _cache_dir() / "kernels" / f"gemv-{key}.so"
    try:
        if not path.is_file():
            _compile(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("CPU kernels off (falling back to torch's): %s", exc)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.rf_q4_1_gemv.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.rf_q8_0_gemv.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.rf_quantize_x_q8.argtypes = [ptr, ptr, ptr, ptr, i64, i64]
    lib.rf_q4_1_q8_gemv.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    for fn in (lib.rf_q4_1_gemv, lib.rf_q8_0_gemv, lib.rf_quantize_x_q8, lib.rf_q4_1_q8_gemv):
        fn.restype = None
    return lib


def available() -> bool:
    return _library() is not None


# ---- weights ----

@dataclass
class Q4_1Weight:
    nibbles: torch.Tensor  # [N, K / 2] uint8, see gemv.c for the order within a group
    scale: torch.Tensor  # [N, K / 32] float32
    low: torch.Tensor  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return self.nibbles.shape[0], self.nibbles.shape[1] * 2


@dataclass
class Q8_0Weight:
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]


def pack_q4_1(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> Q4_1Weight:
    """q [N, K] integers in 0..15, scale and low [N, K / 32]: w = low + q * scale."""
    n, k = q.shape
    groups = q.to(torch.uint8).view(n, k // GROUP, 2, GROUP // 2)
    nibbles = groups[:, :, 0] | (groups[:, :, 1] << 4)  # q[j] low, q[j + 16] high
    return Q4_1Weight(nibbles.reshape(n, k // 2).contiguous(),
                      scale.float().contiguous(), low.float().contiguous())


def unpack_q4_1(w: Q4_1Weight) -> torch.Tensor:
    """The dequantized [N, K] float32 weights."""
    n, k = w.shape
    b = w.nibbles.view(n, k // GROUP, GROUP // 2)
    q = torch.cat([b & 0x0F, b >> 4], dim=-1).float()  # [N, G, 32]
    return (w.low[..., None] + q * w.scale[..., None]).view(n, k)


def quantize_q8_0(weight: torch.Tensor) -> Q8_0Weight:
    """Symmetric int8 groups of 32 (GGUF's Q8_0): exact for weights that came from Q8_0."""
    n, k = weight.shape
    groups = weight.float().view(n, k // GROUP, GROUP)
    scale = groups.abs().amax(-1) / 127
    q = (groups / scale.clamp(min=1e-30)[..., None]).round().clamp(-127, 127)
    return Q8_0Weight(q.to(torch.int8).view(n, k).contiguous(), scale.contiguous())


def unpack_q8_0(w: Q8_0Weight) -> torch.Tensor:
    n, k = w.shape
    return (w.q.float().view(n, k // GROUP, GROUP) * w.scale[..., None]).view(n, k)


# ---- products ----

def _check_input(x: torch.Tensor, k: int) -> torch.Tensor:
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"expected x of shape [M, {k}], got {tuple(x.shape)}")
    if x.device.type != "cpu":
        raise ValueError("CPU kernels need CPU tensors")
    return x.float().contiguous()


def q4_1_gemv(x: torch.Tensor, w: Q4_1Weight) -> torch.Tensor:
    """x [M, K] (any float dtype) @ dequant(w).T -> [M, N] float32."""
    lib = _library()
    n, k = w.shape
    x = _check_input(x, k)
    if lib is None:
        return q4_1_reference(x, w)
    m = x.shape[0]
    xsum = x.view(m, k // GROUP, GROUP).sum(-1)
    y = torch.empty(m, n, dtype=torch.float32)
    lib.rf_q4_1_gemv(w.nibbles.data_ptr(), w.scale.data_ptr(), w.low.data_ptr(), x.data_ptr(),
                     xsum.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads())
    return y


def q4_1_q8_gemv(x: torch.Tensor, w: Q4_1Weight) -> torch.Tensor:
    """Like q4_1_gemv, with x rounded to int8 per group of 32 first (see gemv.c); needs VNNI."""
    lib = _library()
    n, k = w.shape
    x = _check_input(x, k)
    if lib is None or not has_vnni():
        return q4_1_q8_reference(x, w)
    m, g = x.shape[0], k // GROUP
    xq = torch.empty(m, k, dtype=torch.int8)
    dx, xs = torch.empty(m, g), torch.empty(m, g)
    lib.rf_quantize_x_q8(x.data_ptr(), xq.data_ptr(), dx.data_ptr(), xs.data_ptr(), m, k)
    y = torch.empty(m, n, dtype=torch.float32)
    lib.rf_q4_1_q8_gemv(w.nibbles.data_ptr(), w.scale.data_ptr(), w.low.data_ptr(), xq.data_ptr(),
                        dx.data_ptr(), xs.data_ptr(), y.data_ptr(), m, n, k, torch.get_num_threads())
    return y


def quantize_x_q8_reference(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 per group of 32 (scale max|x| / 127), dequantized again."""
    m, k = x.shape
    groups = x.float().view(m, k // GROUP, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    dx = amax / 127
    q = groups * torch.where(amax > 0, 127 / amax.clamp(min=1e-30), 0.0)  # as gemv.c rounds
    q = torch.where(q < 0, q - 0.5, q + 0.5).trunc().clamp(-127, 127)  # C's round half away
    return (q * dx).view(m, k)


def q4_1_q8_reference(x: torch.Tensor, w: Q4_1Weight) -> torch.Tensor:
    return quantize_x_q8_reference(x) @ unpack_q4_1(w).T


def q8_0_gemv(x: torch.Tensor, w: Q8_0Weight) -> torch.Tensor:
    lib = _library()
    n, k = w.shape
    x = _check_input(x, k)
    if lib is None:
        return q8_0_reference(x, w)
    y = torch.empty(x.shape[0], n, dtype=torch.float32)
    lib.rf_q8_0_gemv(w.q.data_ptr(), w.scale.data_ptr(), x.data_ptr(), y.data_ptr(),
                     x.shape[0], n, k, torch.get_num_threads())
    return y


def q4_1_reference(x: torch.Tensor, w: Q4_1Weight) -> torch.Tensor:
    return x.float() @ unpack_q4_1(w).T


def q8_0_reference(x: torch.Tensor, w: Q8_0Weight) -> torch.Tensor:
    return x.float() @ unpack_q8_0(w).T
