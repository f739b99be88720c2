"""The model's own sampling defaults (`--sampling-defaults model`, vLLM's `--generation-config
auto`): what a request that leaves temperature, top_p, top_k, min_p or repetition_penalty
unset (or null) gets.

Read once at start-up on the scheduler side (Scheduler.model_info's `default_sampling_params`)
from the model folder's generation_config.json and, for a model converted from a GGUF file,
that file's `general.sampling.*` metadata (llama.cpp's names; the GGUF wins where both set a
value). The HTTP side and the Engine take them from model_info and hand them to
SamplingParams.from_dict, the one place a request's options are read: a value the request
gives always wins. `--sampling-defaults openai` keeps radixflow's constants (OpenAI's and
SGLang's: temperature 1, top_p 1, top_k off, min_p 0, repetition_penalty 1).

As vLLM and SGLang do, `do_sample` is not read: a model that ships `temperature: 0.6` samples
at 0.6 even where its file also says `do_sample: false`.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InvalidRequest
from ..sampling_params import SamplingParams, check_option
from .cache import MARKER

logger = logging.getLogger(__name__)

# The options a model may default, by SamplingParams' names.
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# The model_info key carrying the defaults in force (all five) to the HTTP side, and shown by
# /get_model_info.
MODEL_INFO_KEY = "default_sampling_params"
# llama.cpp's GGUF sampling metadata (gguf.Keys.General.SAMPLING_*) -> our option.
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
MODES = ("model", "openai")


def constant_defaults() -> dict[str, Any]:
    """radixflow's own defaults of the five options (`--sampling-defaults openai`)."""
    params = SamplingParams()
    return {key: getattr(params, key) for key in SAMPLING_DEFAULT_KEYS}


def sampling_defaults(model_folder: Path | None, mode: str = "model") -> dict[str, Any]:
    """The defaults in force: the model's values over the constants (mode "model"), or the
    constants alone (mode "openai", or no folder)."""
    if mode not in MODES:
        raise ValueError(f"--sampling-defaults must be one of {MODES}, got {mode!r}")
    defaults = constant_defaults()
    if mode == "model" and model_folder is not None:
        defaults.update(model_defaults(Path(model_folder)))
    return defaults


def model_defaults(folder: Path) -> dict[str, Any]:
    """The options the model itself sets (checked; a bad value is dropped with a warning)."""
    found: dict[str, tuple[Any, str]] = {}
    gen_config = folder / "generation_config.json"
    for key, value in _json_object(gen_config).items():
        if key in SAMPLING_DEFAULT_KEYS and value is not None:
            found[key] = (value, f"{gen_config.name} {key}")
    gguf = gguf_source(folder)
    if gguf is not None:
        for gguf_key, value in read_gguf_metadata(gguf, GGUF_SAMPLING_KEYS).items():
            found[GGUF_SAMPLING_KEYS[gguf_key]] = (value, f"{gguf.name} {gguf_key}")
    checked = {}
    for key, (value, where) in found.items():
        try:
            checked[key] = check_option(key, _normalised(key, value))
        except InvalidRequest as exc:
            logger.warning("ignoring the model's sampling default %s = %r: %s", where, value,
                           exc.message)
    if checked:
        logger.info("sampling defaults from the model (requests may override them; "
                    "--sampling-defaults openai ignores them): %s",
                    ", ".join(f"{k}={v}" for k, v in checked.items()))
    return checked


def defaults_of(model_info: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The defaults a request parser applies, from a scheduler's model_info (None: none)."""
    return (model_info or {}).get(MODEL_INFO_KEY)


def _normalised(key: str, value: Any) -> Any:
    """HF's and llama.cpp's spellings as ours: top_k <= 0 (either's "off") is -1, an integral
    float top_k an int."""
    if key == "top_k" and isinstance(value, int | float) and not isinstance(value, bool):
        if value <= 0:
            return -1
        if float(value).is_integer():
            return int(value)
    return value


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        logger.warning("ignoring %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def gguf_source(folder: Path) -> Path | None:
    """The .gguf file a converted folder was made from (its cache marker says), if it is
    still there."""
    source = _json_object(folder / MARKER).get("source")
    if not isinstance(source, str) or not source.lower().endswith(".gguf"):
        return None
    path = Path(source)
    return path if path.is_file() else None


# GGUF value types (the GGUF spec's gguf_type) -> struct format of a scalar.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: Path, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar metadata values of `path` whose keys are in `wanted`.

    Reads the header's key-value section only (no tensor data; other values, the vocabulary
    arrays among them, are skipped over). A file that is not a readable GGUF gives {} and a
    warning: the defaults are a convenience, not a reason to refuse the model.
    """
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError("not a GGUF file")
            (version,) = struct.unpack("<I", f.read(4))
            if version < 2:
                raise ValueError(f"GGUF version {version} is not supported")
            _, count = struct.unpack("<QQ", f.read(16))
            out: dict[str, Any] = {}
            for _ in range(count):
                key = _read_string(f)
                (kind,) = struct.unpack("<I", f.read(4))
                if key in wanted and kind in _SCALARS:
                    out[key] = _read_scalar(f, kind)
                else:
                    _skip_value(f, kind)
            return out
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        logger.warning("could not read the sampling metadata of %s: %s", path, exc)
        return {}


def _read_string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length).decode("utf-8")


def _read_scalar(f: BinaryIO, kind: int) -> Any:
    fmt = _SCALARS[kind]
    (value,) = struct.unpack(fmt, f.read(struct.calcsize(fmt)))
    # a float32's shortest decimal (0.6, not 0.6000000238418579), as llama.cpp prints it
    return float(f"{value:.7g}") if kind == 6 else value


def _skip_value(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[kind]), 1)
    elif kind == _STRING:
        (length,) = struct.unpack("<Q", f.read(8))
        f.seek(length, 1)
    elif kind == _ARRAY:
        item, n = struct.unpack("<IQ", f.read(12))
        if item in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[item]), 1)
        else:
            for _ in range(n):
                _skip_value(f, item)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
