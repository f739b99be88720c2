"""Building one level's CPU kernels: compiled once per machine with the system C compiler into
the radixflow cache folder (keyed by a hash of the sources and flags), loaded with ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import abi
from .features import LEVEL_FLAGS

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
HEADERS = [HERE / "gemv.h", HERE / "decode.h"]
COMMON_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")


def sources(level: str) -> list[Path]:
    """The C files of one level's build."""
    return [HERE / f"gemv_{level}.c", HERE / f"step_{level}.c", HERE / "gemm.c", HERE / "decode.c",
            HERE / "rows.c", HERE / "repack.c"]


def cache_dir() -> Path:
    """Where compiled kernels go: $RADIXFLOW_CACHE, else $XDG_CACHE_HOME/radixflow, else
    ~/.cache/radixflow (the model cache's rule), then kernels/."""
    env = os.environ.get("RADIXFLOW_CACHE")
    if env:
        return Path(env).expanduser() / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else None
    return (base or Path.home() / ".cache") / "radixflow" / "kernels"


def compile_level(level: str, dest: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) found")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        cmd = [cc, *COMMON_FLAGS, *LEVEL_FLAGS[level], *map(str, sources(level)), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(out, dest)  # atomic: a concurrent process sees the whole library or none


def load(level: str, tile: int, group: int) -> ctypes.CDLL | None:
    """The build of `level` (compiled first if the cache lacks it), its limits checked against
    the layout's tile and group; None, with a warning, where it cannot be built or loaded."""
    text = b"".join(p.read_bytes() for p in (*sources(level), *HEADERS))
    flags = " ".join((*COMMON_FLAGS, *LEVEL_FLAGS[level]))
    key = hashlib.sha256(text + flags.encode()).hexdigest()[:16]
    path = cache_dir() / f"cpu-{level}-{key}.so"
    try:
        if not path.is_file():
            compile_level(level, path)
        lib = ctypes.CDLL(str(path))
        lib.rf_limits = abi.check(lib, tile, group)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("CPU kernels off (falling back to torch's): %s", exc)
        return None
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    for name in (f"rf_{fmt}_gemm" for fmt in abi.FORMATS):
        getattr(lib, name).argtypes = [ptr, ptr, ptr, i32, i64, i64, i64, i32]
        getattr(lib, name).restype = None
    lib.rf_set_batch_int8_rows.argtypes = [i32]
    lib.rf_set_batch_int8_rows.restype = None
    lib.rf_argmax_rows.argtypes = [ptr, i64, i64, ptr]
    lib.rf_dequant_rows.argtypes = [i32, ptr, ptr, i32, i64, i64, i64, i32]
    lib.rf_dequant_rows.restype = None
    lib.rf_argmax_rows.restype = None
    lib.rf_repack.argtypes = [i32, i32, ptr, i64, i64, ptr, i32]
    lib.rf_repack.restype = i64
    return lib
