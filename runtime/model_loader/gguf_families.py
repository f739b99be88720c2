"""What transformers' GGUF reader loses of a family, put back (llama.cpp's arch names).

transformers reads llama, mistral, qwen2, qwen3, phi3, gemma2 and gemma3 GGUFs (among
others radixflow does not load). Of those:
- phi3: `phi3.rope.dimension_count` is dropped, so Phi-4-mini's partial rotary (96 of 128
  dims) would come back as full rotary; it is read here and set as partial_rotary_factor.
- gemma2 / gemma3: query_pre_attn_scalar is not in the file and transformers' default (256)
  is wrong for the 27B models; it is set as llama.cpp computes the scale. Gemma 2's
  `attn_logit_softcapping` / `final_logit_softcapping` are read. (Gemma 3's local RoPE base
  10000 and window pattern 6 are llama.cpp's fixed values and transformers' defaults too.)
- qwen3moe / qwen2moe: the experts' `expert_feed_forward_length` (and Qwen2-MoE's
  `expert_shared_feed_forward_length`) are dropped, leaving transformers' defaults; read here.
  (transformers sets norm_topk_prob for qwen3moe, as llama.cpp computes it.)
Files of llama.cpp's granite, smollm3 and olmoe archs, which transformers' reader refuses, and
Mixtral (a `llama` file with stacked experts, which it would read as a dense Llama) are read by
gguf_own_reader.py instead, and never come here.
"""

from __future__ import annotations

from pathlib import Path

# families radixflow loads from their HF folder only, not from a GGUF (none today)
HF_FOLDER_ONLY: tuple[str, ...] = ()


def fix_family_config(config, gguf_path: Path) -> None:
    """Set on `config` (a transformers config read from `gguf_path`) what its reader drops."""
    arch = {"gemma3_text": "gemma3", "qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe"}.get(
        config.model_type, config.model_type)
    if arch not in ("phi3", "gemma2", "gemma3", "qwen3moe", "qwen2moe"):
        return
    from .gguf_tensors import gguf_reader

    fields = gguf_reader(gguf_path).fields

    def read(key: str):
        field = fields.get(f"{arch}.{key}")
        return None if field is None else field.contents()

    if arch == "phi3":
        _set_partial_rotary(config, read("rope.dimension_count"))
        return
    if arch in ("qwen3moe", "qwen2moe"):
        for key, attr in (("expert_count", "num_experts"),
                          ("expert_used_count", "num_experts_per_tok"),
                          ("expert_feed_forward_length", "moe_intermediate_size"),
                          ("expert_shared_feed_forward_length",
                           "shared_expert_intermediate_size")):
            if (value := read(key)) is not None:
                setattr(config, attr, int(value))
        return
    # llama.cpp's softmax scale: 1/sqrt(head_dim), but 1/sqrt(hidden/heads) for the 27B models
    # (Gemma 2: 46 layers, Gemma 3: 62), which is what their query_pre_attn_scalar says
    big = config.num_hidden_layers == (46 if arch == "gemma2" else 62)
    config.query_pre_attn_scalar = (config.hidden_size // config.num_attention_heads if big
                                    else config.head_dim)
    if arch == "gemma2":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if (value := read(key)) is not None:
                setattr(config, key, float(value))


def _set_partial_rotary(config, rotary_dim) -> None:
    head_dim = config.hidden_size // config.num_attention_heads
    if rotary_dim is None or int(rotary_dim) == head_dim:
        return
    factor = int(rotary_dim) / head_dim
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):  # transformers >= 5 reads it from here
        params["partial_rotary_factor"] = factor
    config.partial_rotary_factor = factor


def read_error_hint(error: Exception) -> str:
    """A sentence to add to transformers' error for an arch radixflow loads from HF only."""
    text = str(error)
    for arch in HF_FOLDER_ONLY:
        if f"architecture {arch} " in text:
            return (f" (radixflow loads {arch} models from their Hugging Face folder, not "
                    "from a GGUF)")
    return ""
