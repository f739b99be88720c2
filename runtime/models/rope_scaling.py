"""RoPE settings read from an HF config: the base, the scaling dict rope.py computes from, and
how many positions the model may serve.

`rope_settings(config)` accepts both spellings transformers has used: `rope_theta` +
`rope_scaling` (transformers < 5) and `rope_parameters` (transformers >= 5, theta inside).
The scaling dict it returns is normalised the way transformers' `standardize_rope_params`
does, so rope.py needs nothing else from the config:

- `rope_type` is set (`type` is the old key; `su` is Phi-3's old name for `longrope`, and
  Phi-3's config also maps `yarn` to `longrope`); "default" becomes no scaling (None);
- llama3 / yarn / longrope get `original_max_position_embeddings`: a top-level config value
  wins (Phi-3 keeps it there, with 4096 as its class default), then the dict's own, then
  `max_position_embeddings`;
- `max_position_embeddings` (the config's) is copied in: yarn and longrope derive `factor`
  from it when the dict has none, dynamic NTK scales against it.

Supported types: linear, dynamic, yarn, longrope (su), llama3; any other is refused at start.

`max_positions`: the positions the model can serve. The config's `max_position_embeddings`,
except for YaRN, whose factor states the extended length: `original * factor` when that is
larger (Qwen2.5 / Qwen3 ship max_position_embeddings 32768 / 40960 and ask users to add
`{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}` for 128k, and
vLLM and SGLang serve original * factor then). Dynamic NTK keeps the config's length: within
it, transformers' dynamic NTK is the unscaled RoPE (see rope.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest

SUPPORTED_ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3")
_ALIASES = {"su": "longrope"}
_PHI3_ALIASES = {"su": "longrope", "yarn": "longrope"}  # transformers' Phi3Config
_PHI3_ORIGINAL_DEFAULT = 4096  # Phi3Config.original_max_position_embeddings
_NEEDS_ORIGINAL = ("llama3", "yarn", "longrope")
_REQUIRED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor",),
}


@dataclass(frozen=True)
class RopeSettings:
    theta: float
    scaling: dict[str, Any] | None  # normalised (module docstring); None: plain RoPE
    max_positions: int  # positions the model may serve


def rope_settings(config: dict[str, Any]) -> RopeSettings:
    """The RoPE base, normalised scaling and servable length of an HF config.json dict.
    Raises InvalidRequest (param "model") for a scaling type radixflow does not compute."""
    params = dict(config.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    params.pop("partial_rotary_factor", None)  # the head's rotary width, not a scaling
    scaling = config.get("rope_scaling") or (params if params else None)
    max_pos = int(config.get("max_position_embeddings", 2048))
    if not scaling:
        return RopeSettings(theta, None, max_pos)
    archs = config.get("architectures") or []
    scaling = normalise_scaling(scaling, config, phi3=bool(archs) and archs[0].startswith("Phi3"))
    return RopeSettings(theta, scaling, serving_positions(scaling, max_pos))


def normalise_scaling(scaling: dict[str, Any], config: dict[str, Any], *,
                      phi3: bool = False) -> dict[str, Any] | None:
    """One flat rope-scaling dict -> the normalised dict (None for "default")."""
    scaling = dict(scaling)
    scaling.pop("rope_theta", None)
    scaling.pop("partial_rotary_factor", None)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    kind = (_PHI3_ALIASES if phi3 else _ALIASES).get(kind, kind)
    if kind == "default":
        return None
    if kind not in SUPPORTED_ROPE_TYPES:
        raise InvalidRequest(
            f"unsupported rope scaling type {kind!r}; supported: default, "
            f"{', '.join(SUPPORTED_ROPE_TYPES)} (su is longrope)", param="model")
    scaling.pop("type", None)
    scaling["rope_type"] = kind
    max_pos = int(config.get("max_position_embeddings", 2048))
    scaling["max_position_embeddings"] = max_pos
    if kind in _NEEDS_ORIGINAL:
        top = config.get("original_max_position_embeddings")
        if top is None and phi3:
            top = _PHI3_ORIGINAL_DEFAULT
        original = top if top is not None else scaling.get("original_max_position_embeddings")
        scaling["original_max_position_embeddings"] = int(original or max_pos)
    missing = [k for k in _REQUIRED[kind]
               if scaling.get(k) is None and not (k == "factor" and kind == "yarn")]
    if missing:
        raise InvalidRequest(f"rope scaling {kind!r} needs {', '.join(missing)} in the "
                             "model's config", param="model")
    return scaling


def serving_positions(scaling: dict[str, Any] | None, max_pos: int) -> int:
    """How many positions a model with this (normalised) scaling may serve."""
    if scaling and scaling["rope_type"] == "yarn" and scaling.get("factor"):
        extended = int(scaling["original_max_position_embeddings"] * float(scaling["factor"]))
        return max(max_pos, extended)
    return max_pos
