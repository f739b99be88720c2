"""What transformers' GGUF reader loses of a family, put back (llama.cpp's arch names).

transformers reads llama, mistral, qwen2, qwen3, phi3, gemma2 and gemma3 GGUFs (among
others radixflow does not load). Of those:
- phi3: `phi3.rope.dimension_count` is dropped, so Phi-4-mini's partial rotary (96 of 128
  dims) would come back as full rotary; it is read here and set as partial_rotary_factor.
Files of llama.cpp's granite and smollm3 archs are refused by transformers' reader; the
error names the arch and says to load the model's HF folder instead.
"""

from __future__ import annotations

from pathlib import Path

HF_FOLDER_ONLY = ("granite", "smollm3")


def fix_family_config(config, gguf_path: Path) -> None:
    """Set on `config` (a transformers config read from `gguf_path`) what its reader drops."""
    if config.model_type != "phi3":
        return
    from gguf import GGUFReader

    field = GGUFReader(gguf_path).fields.get("phi3.rope.dimension_count")
    head_dim = config.hidden_size // config.num_attention_heads
    if field is None or int(field.contents()) == head_dim:
        return
    factor = int(field.contents()) / head_dim
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
