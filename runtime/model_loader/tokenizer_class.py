"""Which tokenizer class transformers' AutoTokenizer picks for a folder, remembered.

AutoTokenizer decides from the model's config (`AutoConfig`), and importing that machinery
imports torch: ~4 s of CPU in a process that only tokenizes (the HTTP server; at start-up it
competes with the scheduler for the cores, ~3 s of a default-model start on 2 cores). Every
branch of that decision ends in `<class>.from_pretrained(folder, **kwargs)`, so once a folder's
class is known a later load calls it directly, importing only the tokenizer's own module.

The record (radixflow's cache folder, `tokenizer-classes/`) is keyed by the folder's path, the
size and mtime of each file the decision reads, and the transformers version: any change
there, and the next load asks AutoTokenizer again. Classes from a model's own code
(trust_remote_code) are never recorded.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from .cache import default_cache_dir

logger = logging.getLogger(__name__)

# The files AutoTokenizer's choice (and the tokenizer's own loading) reads from a folder.
_DECISION_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json",
                   "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json")
# Passed by AutoTokenizer to the class it picks (a local folder: no revision, no commit hash).
_FROM_AUTO = {"_from_auto": True}


def record_path(folder: Path) -> Path | None:
    """Where the folder's record is (or would be) kept, as the folder is now; None without
    transformers."""
    try:
        from transformers import __version__ as transformers_version
    except ImportError:
        return None
    folder = folder.resolve()
    key = hashlib.sha256(f"{folder}|{transformers_version}".encode())
    for name in _DECISION_FILES:
        try:
            st = (folder / name).stat()
        except OSError:
            key.update(f"|{name}:-".encode())
            continue
        key.update(f"|{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return default_cache_dir() / "tokenizer-classes" / f"{key.hexdigest()[:32]}.json"


def load_recorded(folder: Path, **kwargs: Any) -> Any | None:
    """The folder's tokenizer through the class AutoTokenizer picked for it last time, or None
    (no record, or one that no longer applies)."""
    path = record_path(folder)
    if path is None or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        cls = getattr(importlib.import_module(record["module"]), record["class"])
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as e:
        logger.debug("tokenizer class record %s not used: %s", path, e)
        return None
    return cls.from_pretrained(str(folder), **_FROM_AUTO, **kwargs)


def is_recorded(folder: Path) -> bool:
    """Whether the folder's class is recorded, as the folder is now."""
    path = record_path(folder)
    return path is not None and path.is_file()


def load_and_record(folder: Path, **kwargs: Any) -> Any:
    """AutoTokenizer's tokenizer for the folder; the class it picked is recorded."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
    cls = type(tokenizer)
    if cls.__module__.startswith("transformers."):
        _write(folder, {"module": cls.__module__, "class": cls.__name__})
    return tokenizer


def _write(folder: Path, record: dict) -> None:
    path = record_path(folder)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache: every load asks AutoTokenizer
        logger.debug("tokenizer class not recorded at %s: %s", path, e)
