"""AVX-512 matrix-vector product over GGUF-style Q8_0 weights, for CPU decode.

gemv.c is compiled once per machine with the system C compiler into the radixflow cache
folder and loaded with ctypes (no torch headers: it builds in about a second). Where there is
no AVX-512 or no compiler, `available()` is False and callers keep their torch path.

The kernel has a torch reference (`q8_0_reference`) that the tests compare against.
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
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp", "-shared", "-fPIC"]


def _cpu_has_avx512() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl"))


def _compile(dest: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) found")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(out)],
                              capture_output=True, text=True, timeout=120, check=False)
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
    from radixflow.runtime.model_loader.cache import default_cache_dir  # one rule for the cache

    path = default_cache_dir() / "kernels" / f"gemv-{key}.so"
    try:
        if not path.is_file():
            _compile(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("CPU kernels off (falling back to torch's): %s", exc)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.rf_q8_0_gemv.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.rf_q8_0_gemv.restype = None
    return lib


def available() -> bool:
    return _library() is not None


# ---- weights ----

@dataclass
class Q8_0Weight:
    q: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N, K / 32] float32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]


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


def q8_0_reference(x: torch.Tensor, w: Q8_0Weight) -> torch.Tensor:
    return x.float() @ unpack_q8_0(w).T
