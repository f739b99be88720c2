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

import math
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


# --- GGUF --------------------------------------------------------------------------------------
# transformers' GGUF reader keeps only rope.freq_base, so a converted folder would lose every
# scaling. What llama.cpp's convert_hf_to_gguf.py writes instead, per type:
# - linear: {arch}.rope.scaling.type "linear" and .factor;
# - yarn: .type "yarn", .factor, .original_context_length, and when the HF config had them
#   .yarn_beta_fast / .yarn_beta_slow / .yarn_attn_factor (HF's attention_factor) /
#   .yarn_ext_factor (not an HF parameter: only 1.0, HF's, is accepted);
#   .yarn_log_multiplier is llama.cpp's per-arch attention temperature (DeepSeek, Mistral 3),
#   which the Llama blocks do not apply: refused;
# - longrope (Phi-3): tensors rope_factors_long / rope_factors_short, .original_context_length,
#   .attn_factor (sqrt(1 + ln s / ln L), what HF derives);
# - llama3: no keys at all, a rope_freqs tensor of per-dimension divisors of inv_freq; the HF
#   parameters (factor, low/high_freq_factor, original length) are recovered from it and
#   checked to give those divisors back, else refused.
GGUF_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def scaling_from_gguf(meta: dict[str, Any], tensors: dict[str, Any], *, theta: float
                      ) -> dict[str, Any] | None:
    """HF rope-scaling fields for a GGUF: `meta` its metadata (key -> value), `tensors` its
    rope tensors (GGUF_ROPE_TENSORS present, as float arrays). None: plain RoPE. Raises
    ValueError for what radixflow cannot express."""
    arch = meta.get("general.architecture", "llama")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.rope.scaling.{name}", default)

    kind = key("type", "none")
    original = key("original_context_length")
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(key("factor"))}
    if kind == "yarn":
        if float(key("yarn_log_multiplier", 0.0) or 0.0) != 0.0:
            raise ValueError(f"{arch}.rope.scaling.yarn_log_multiplier (llama.cpp's attention "
                             "temperature for DeepSeek / Mistral 3) is not supported")
        if float(key("yarn_ext_factor", 1.0)) != 1.0:
            raise ValueError(f"{arch}.rope.scaling.yarn_ext_factor "
                             f"{key('yarn_ext_factor')} is not supported (only 1.0, HF's YaRN)")
        out: dict[str, Any] = {"rope_type": "yarn", "factor": float(key("factor"))}
        if original is not None:
            out["original_max_position_embeddings"] = int(original)
        for gguf_name, hf_name in (("yarn_beta_fast", "beta_fast"),
                                   ("yarn_beta_slow", "beta_slow"),
                                   ("yarn_attn_factor", "attention_factor")):
            if key(gguf_name) is not None:
                out[hf_name] = float(key(gguf_name))
        return out
    long, short = tensors.get("rope_factors_long.weight"), tensors.get("rope_factors_short.weight")
    if kind == "longrope" or long is not None or short is not None:
        if long is None or short is None:
            raise ValueError("longrope needs both rope_factors_long and rope_factors_short")
        long, short = [float(x) for x in long], [float(x) for x in short]
        if all(x == 1.0 for x in long + short) and kind != "longrope":
            return None
        out = {"rope_type": "longrope", "long_factor": long, "short_factor": short}
        if original is not None:
            out["original_max_position_embeddings"] = int(original)
        if key("attn_factor") is not None:
            out["attention_factor"] = float(key("attn_factor"))
        return out
    if kind not in ("none", None):
        raise ValueError(f"{arch}.rope.scaling.type {kind!r} is not supported")
    if tensors.get("rope_freqs.weight") is not None:
        return llama3_from_divisors(tensors["rope_freqs.weight"], theta)
    return None


def llama3_from_divisors(divisors: Any, theta: float) -> dict[str, Any] | None:
    """Llama 3 scaling parameters that give llama.cpp's rope_freqs divisors (ValueError if
    none do). Every Llama 3.x has low/high_freq_factor 1 and 4, so those are tried first."""
    import torch

    from .rope import base_inv_freq, llama3_inv_freq

    want = torch.as_tensor([float(x) for x in divisors], dtype=torch.float64)
    inv_freq = base_inv_freq(2 * want.numel(), theta)
    factor = float(want.max())
    if factor == 1.0 and float(want.min()) == 1.0:
        return None
    wavelen = 2 * math.pi / inv_freq
    medium = (want > 1 + 1e-6) & (want < factor * (1 - 1e-6))
    # smooth = (L / wavelen - low) / (high - low), from divisor = 1 / ((1 - smooth) / f + smooth)
    smooth = (1 / want - 1 / factor) / (1 - 1 / factor)
    bands: list[tuple[float, float, float]] = [(1.0, 4.0, 8192.0)]
    for w, s in zip(wavelen[medium].tolist(), smooth[medium].tolist()):
        bands.append((1.0, 4.0, w * (3 * s + 1)))  # L from one point, low 1 / high 4
    if int(medium.sum()) >= 2:  # any band: smooth = a / wavelen - b, low 1
        x = torch.stack([1 / wavelen[medium], -torch.ones_like(wavelen[medium])], 1)
        a, b = torch.linalg.lstsq(x, smooth[medium, None]).solution.flatten().tolist()
        if b > 0:
            bands.append((1.0, 1.0 + 1.0 / b, a / b))
    if not bool(medium.any()):  # no band point: any L with the right dims on each side
        short_max = float(wavelen[want == 1.0].max()) if bool((want == 1.0).any()) else 0.0
        long_min = float(wavelen[want == factor].min())
        bands.append((1.0, 4.0, (4 * short_max + long_min) / 2))
    for low, high, original in bands:
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                   "high_freq_factor": high, "original_max_position_embeddings": round(original)}
        got = inv_freq / llama3_inv_freq(inv_freq, scaling)
        if torch.allclose(got, want, rtol=1e-5, atol=0):
            return scaling
    raise ValueError("its rope_freqs tensor is not a Llama 3 scaling radixflow can express")


def set_gguf_rope(config: Any, gguf_path: Any) -> None:
    """Put the GGUF's rope scaling (scaling_from_gguf) on `config`, the transformers config
    its reader built. Raises ValueError for a scaling radixflow cannot express."""
    from ..model_loader.gguf_tensors import gguf_reader

    reader = gguf_reader(gguf_path)
    arch_field = reader.fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else "llama"
    prefix = f"{arch}.rope.scaling."
    meta = {name: field.contents() for name, field in reader.fields.items()
            if name.startswith(prefix)}
    meta["general.architecture"] = arch
    tensors = {t.name: t.data for t in reader.tensors if t.name in GGUF_ROPE_TENSORS}
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0))
    try:
        scaling = scaling_from_gguf(meta, tensors, theta=theta)
    except ValueError as e:
        raise ValueError(f"{gguf_path}: rope scaling: {e}") from e
    if scaling is None:
        return
    original = scaling.get("original_max_position_embeddings")
    if original is not None and hasattr(config, "original_max_position_embeddings"):
        config.original_max_position_embeddings = original  # Phi-3 reads it from here
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:  # theta and scaling in one dict
        config.rope_parameters = {**params, "rope_theta": theta, **scaling}
    else:
        config.rope_scaling = scaling
