"""What each Llama-like family adds to the Llama blocks, read from its HF config.json.

`family_fields(family, config, ...)` returns the ModelArgs fields beyond Llama's, as
transformers' modeling_<family>.py reads them (their defaults keep Llama / Qwen unchanged):

- Granite: embedding_multiplier (inputs scaled), residual_multiplier (each block's attention
  and MLP outputs scaled before the residual sum), attention_multiplier (the softmax scale,
  instead of head_dim ** -0.5), logits_scaling (logits divided by it);
- SmolLM3: `no_rope_layers` (1: the layer rotates, 0: NoPE), else every
  `no_rope_layer_interval`-th layer is NoPE;
- Phi-3 / Phi-3.5 / Phi-4-mini: `partial_rotary_factor` (top level or in rope_parameters):
  the first head_dim * factor dims of each head rotate, the rest pass through;
- attention_bias puts a bias on o_proj too (Llama, Granite, SmolLM3, Qwen3; Qwen2's biases
  are on q/k/v only), mlp_bias on gate/up/down.

Gemma 2 / Gemma 3 (gemma_fields): gelu-tanh, query_pre_attn_scalar as the softmax scale,
soft-capping, the windowed layers (layer_types, else every 2nd / every sliding_window_pattern
-th layer global) attended as windows by gemma.py, Gemma 3's local rope base and q/k norms.

Mixture of experts (moe_fields; the blocks are moe.py's): Qwen3-MoE and Qwen2-MoE (sparse
every decoder_sparse_step-th layer outside mlp_only_layers, norm_topk_prob, Qwen2's shared
expert), Mixtral (top-k weights always renormalised), OLMoE (q/k norms over the whole
projection, clip_qkv).

Sliding windows of the other families (window_fields, as transformers' config classes and
masks define them): Mistral, Mixtral, Phi-3 and Qwen3-MoE put `sliding_window` on every layer;
Qwen2 / Qwen3 on the layers at or past `max_window_layers`, Qwen2-MoE on the even layers below
it, SmolLM3 on its NoPE layers (each only with `use_sliding_window`), or as `layer_types` says
where the config lists them. A windowed layer's query at position p sees keys p - W < k <= p.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequest
from .rope_scaling import rope_settings

_SILU_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "granite", "smollm3", "phi3",
                  "qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
_MOE_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")


def family_fields(family: str, config: dict[str, Any], num_layers: int,
                  head_dim: int) -> dict[str, Any]:
    if family in ("gemma2", "gemma3"):
        return gemma_fields(family, config, num_layers)
    arch = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    act = config.get("hidden_act", "silu")
    if family in _SILU_FAMILIES and act != "silu":
        raise InvalidRequest(f"{arch} with hidden_act {act!r} is not supported (radixflow's "
                             "Llama blocks compute SiLU-gated MLPs)", param="model")
    fields: dict[str, Any] = {
        "o_proj_bias": (family not in ("qwen2", "qwen2_moe")
                        and bool(config.get("attention_bias", False))),
        "mlp_bias": bool(config.get("mlp_bias", False)),
        **window_fields(family, config, num_layers),
    }
    if family == "granite":
        fields.update(
            embedding_multiplier=float(config.get("embedding_multiplier", 1.0)),
            residual_multiplier=float(config.get("residual_multiplier", 1.0)),
            attention_multiplier=float(config.get("attention_multiplier", 1.0)),
            logits_scaling=float(config.get("logits_scaling", 1.0)))
    if family == "smollm3":
        fields["nope_layers"] = tuple(i for i, rope in enumerate(_smollm3_rope(config, num_layers))
                                      if not rope)
    if family == "phi3":
        factor = (config.get("rope_parameters") or {}).get(
            "partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
        rotary_dim = int(head_dim * float(factor))
        if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
            raise InvalidRequest(f"{arch}: partial_rotary_factor {factor} gives {rotary_dim} "
                                 f"rotary dims of a {head_dim}-dim head (need an even count "
                                 "> 0)", param="model")
        fields["rotary_dim"] = rotary_dim
    if family in _MOE_FAMILIES:
        fields.update(moe_fields(family, config, num_layers))
    return fields


def moe_fields(family: str, config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """The routed experts of Qwen3-MoE / Qwen2-MoE (decoder_sparse_step, mlp_only_layers,
    Qwen2's shared expert), Mixtral (top-k always renormalised) and OLMoE (whole-projection
    q/k norms, clip_qkv), as transformers' modeling_<family>.py reads them."""
    arch = (config.get("architectures") or [family])[0]
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    top_k = int(config.get("num_experts_per_tok") or 0)
    if not 0 < top_k <= experts:
        raise InvalidRequest(f"{arch}: num_experts_per_tok {top_k} of {experts} experts "
                             "(need 0 < top_k <= experts)", param="model")
    fields: dict[str, Any] = {"num_experts": experts, "num_experts_per_tok": top_k}
    if family in ("qwen3_moe", "qwen2_moe"):
        step = int(config.get("decoder_sparse_step") or 1)
        only = set(config.get("mlp_only_layers") or ())
        fields.update(
            moe_intermediate_size=int(config["moe_intermediate_size"]),
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
            dense_layers=tuple(i for i in range(num_layers)
                               if i in only or (i + 1) % step != 0))
        if family == "qwen2_moe":
            fields["shared_expert_intermediate_size"] = int(
                config.get("shared_expert_intermediate_size") or 0)
    else:  # Mixtral, OLMoE: every layer sparse, experts of intermediate_size
        fields.update(moe_intermediate_size=int(config["intermediate_size"]),
                      norm_topk_prob=family == "mixtral" or bool(config.get("norm_topk_prob")))
    if family == "olmoe":
        clip = config.get("clip_qkv")
        fields.update(qk_norm_per_head=False, clip_qkv=float(clip) if clip else None)
    return fields


def gemma_fields(family: str, config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """Gemma 2 / Gemma 3 (text): gemma.py's blocks read these (and rope_theta/rope_scaling
    here are the global layers')."""
    arch = (config.get("architectures") or [family])[0]
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise InvalidRequest(f"{arch} with hidden_activation {act!r} is not supported (Gemma's "
                             "blocks compute gelu with the tanh approximation)", param="model")
    pattern = 2 if family == "gemma2" else int(config.get("sliding_window_pattern", 6))
    types = config.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    window = config.get("sliding_window")
    fields: dict[str, Any] = {
        "attention_multiplier": float(config.get("query_pre_attn_scalar", 256)) ** -0.5,
        "attn_softcap": config.get("attn_logit_softcapping",
                                   50.0 if family == "gemma2" else None),
        "final_softcap": config.get("final_logit_softcapping",
                                    30.0 if family == "gemma2" else None),
        "attn_window": int(window) if window else None,
        "window_layers": tuple(i for i, t in enumerate(types)
                               if t == "sliding_attention") if window else (),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", True)),
        "qk_norm": family == "gemma3",
        "o_proj_bias": bool(config.get("attention_bias", False)),
    }
    if family == "gemma3":
        params = config.get("rope_parameters") or {}
        if "full_attention" in params:  # transformers >= 5: one set per layer type
            glob = rope_settings({**config, "rope_parameters": params["full_attention"]})
            local = rope_settings({**config, "rope_parameters": params["sliding_attention"]})
            if local.scaling is not None:
                raise InvalidRequest(f"{arch}: rope scaling of the local layers is not "
                                     "supported", param="model")
            local_theta = local.theta
        else:
            glob = rope_settings({"rope_theta": 1e6, **config})
            local_theta = float(config.get("rope_local_base_freq", 10000.0))
        fields.update(rope_theta=glob.theta, rope_scaling=glob.scaling,
                      max_position_embeddings=glob.max_positions, rope_local_theta=local_theta)
    return fields


def _smollm3_rope(config: dict[str, Any], num_layers: int) -> list[int]:
    layers = config.get("no_rope_layers")
    if layers is None:
        interval = int(config.get("no_rope_layer_interval", 4))
        layers = [int((i + 1) % interval != 0) for i in range(num_layers)]
    return list(layers)


# transformers' config defaults of `sliding_window` where config.json leaves it out
_DEFAULT_WINDOW = {"mistral": 4096, "qwen2": 4096, "qwen3": 4096, "qwen2_moe": 4096,
                   "qwen3_moe": 4096}
_USE_SLIDING_WINDOW = ("qwen2", "qwen3", "smollm3", "qwen2_moe", "qwen3_moe")


def window_fields(family: str, config: dict[str, Any], num_layers: int) -> dict[str, Any]:
    """attn_window and window_layers (the layers attended through it), as transformers'
    modeling_<family>.py picks each layer's mask; {} where no layer is windowed."""
    if family in ("llama", "granite", "olmoe"):
        return {}  # (transformers' Llama, Granite and OLMoE read no window)
    window = config.get("sliding_window", _DEFAULT_WINDOW.get(family))
    if family in _USE_SLIDING_WINDOW and not config.get("use_sliding_window"):
        window = None  # (SmolLM3's explicit layer_types aside, below)
    types = config.get("layer_types")
    if family == "smollm3" and types is not None:
        window = config.get("sliding_window")  # its mask reads the window whatever the flag
    if family in ("mistral", "mixtral", "phi3", "qwen3_moe") or types is None:
        types = _derived_layer_types(family, config, num_layers)
    if not window:
        return {}
    layers = tuple(i for i, t in enumerate(types[:num_layers]) if t == "sliding_attention")
    return {"attn_window": int(window), "window_layers": layers} if layers else {}


def _derived_layer_types(family: str, config: dict[str, Any], num_layers: int) -> list[str]:
    """The layer types a config without `layer_types` gets (its window known to be set)."""
    if family in ("qwen2", "qwen3"):
        first = int(config.get("max_window_layers", 28))
        return ["sliding_attention" if i >= first else "full_attention"
                for i in range(num_layers)]
    if family == "qwen2_moe":
        below = int(config.get("max_window_layers", 28))
        return ["sliding_attention" if (i + 1) % 2 and i < below else "full_attention"
                for i in range(num_layers)]
    if family == "smollm3":
        return ["full_attention" if rope else "sliding_attention"
                for rope in _smollm3_rope(config, num_layers)]
    return ["sliding_attention"] * num_layers  # Mistral, Mixtral, Phi-3, Qwen3-MoE
