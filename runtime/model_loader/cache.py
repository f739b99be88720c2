"""The cache folder, and building a cached folder exactly once across processes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MARKER = ".radixflow-complete"  # written last; a folder without it is an interrupted build
# in a folder prepared from a GGUF: {"path", "size", "plan"} (gguf_tensors reads it)
SOURCE_FILE = "gguf.json"


def default_cache_dir() -> Path:
    """$RADIXFLOW_CACHE, else $XDG_CACHE_HOME/radixflow, else ~/.cache/radixflow."""
    env = os.environ.get("RADIXFLOW_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says to ignore a relative XDG_CACHE_HOME.
    base = Path(xdg).expanduser() if xdg and Path(xdg).expanduser().is_absolute() else None
    return (base or Path.home() / ".cache") / "radixflow"


def is_complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def build_once(folder: Path, build: Callable[[Path], dict[str, Any]]) -> Path:
    """Return `folder`, first filling it with `build(tmp_dir)` unless a complete copy exists.

    `build` writes into an empty temporary folder beside `folder` and returns a JSON-able
    description of what it built; the marker holding it is written last and the temporary
    folder renamed into place, so readers never see a half-written folder. A file lock makes
    concurrent callers wait for one build instead of each doing their own.
    """
    if is_complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.parent / f".{folder.name}.lock", folder):
        if is_complete(folder):  # built by another process while we waited
            return folder
        _remove_leftovers(folder)
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            info = build(tmp)
            (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
            _make_readable(tmp)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _remove_leftovers(folder: Path) -> None:
    """Drop an incomplete `folder` and temp folders of builds that died (we hold the lock)."""
    if folder.exists():
        logger.info("removing incomplete %s", folder)
        shutil.rmtree(folder)
    for tmp in folder.parent.glob(f".{folder.name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


def _make_readable(tmp: Path) -> None:
    """Plain cache permissions: some writers (safetensors) create their files 0600."""
    for path in tmp.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    tmp.chmod(0o755)


@contextlib.contextmanager
def _locked(lock_path: Path, folder: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent first runs may both build
        yield
        return
    with open(lock_path, "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process to finish preparing %s", folder)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
