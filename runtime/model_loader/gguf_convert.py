"""GGUF file -> Hugging Face folder, through transformers' own GGUF reader, or for the files
it cannot read (llama.cpp's granite, smollm3, olmoe and Mixtral files) gguf_own_reader.py.

Either dequantizes each tensor and undoes llama.cpp's q/k row permutation; we only save the
result as float32 safetensors (lossless for dequantized blocks) next to the config, the
tokenizer and its chat template.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ..errors import ModelNotFound
from ..models.rope_scaling import set_gguf_rope
from .gguf_families import fix_family_config, read_error_hint
from .gguf_own_reader import read_gguf, reads_itself

logger = logging.getLogger(__name__)

_MAX_SHARD_SIZE = "4GB"


def convert_gguf(gguf_path: Path, dest: Path) -> dict[str, Any]:
    """Write an HF folder for `gguf_path` into the existing folder `dest`; returns a summary.

    Raises ModelNotFound when transformers cannot read the file (not a GGUF, or an
    architecture it does not support).
    """
    import torch
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig

    start = time.monotonic()
    logger.info("converting %s to a Hugging Face folder (once; may take a minute)", gguf_path)
    try:
        if reads_itself(gguf_path):  # granite, smollm3, olmoe, Mixtral (gguf_own_reader)
            config, tokenizer, skeleton, tensors = read_gguf(gguf_path)
        else:
            config, tokenizer, skeleton, tensors = _read_with_transformers(gguf_path)
        set_gguf_rope(config, gguf_path)  # rope scaling, which the reader drops (rope_scaling)
    except (ValueError, KeyError, OSError) as e:
        raise ModelNotFound(f"could not read {gguf_path} as a GGUF model: {e}"
                            f"{read_error_hint(e)}") from e

    tensors = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
    # llama.cpp drops `output.weight` when the head is tied to the embedding.
    tied = "lm_head.weight" not in tensors
    expected = set(skeleton.state_dict()) - ({"lm_head.weight"} if tied else set())
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ModelNotFound(
            f"{gguf_path} does not match its {type(skeleton).__name__} config: "
            f"missing {missing[:5]}, unexpected {extra[:5]}"
        )

    config.tie_word_embeddings = tied
    config.architectures = [type(skeleton).__name__]
    config.dtype = "float32"  # `torch_dtype` before transformers 5
    tokenizer.model_max_length = config.max_position_embeddings
    config.save_pretrained(dest)
    GenerationConfig.from_model_config(config).save_pretrained(dest)
    save_torch_state_dict(tensors, dest, max_shard_size=_MAX_SHARD_SIZE)
    _save_tokenizer(tokenizer, gguf_path, dest)
    logger.info("converted %s in %.0f s", gguf_path.name, time.monotonic() - start)
    return {
        "source": str(gguf_path),
        "architecture": config.architectures[0],
        "tie_word_embeddings": tied,
        "dtype": "float32",
    }


def _read_with_transformers(gguf_path: Path):
    """(config, tokenizer, skeleton, tensors) through transformers' GGUF reader."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    fix_family_config(config, gguf_path)  # what the reader drops of phi3 (gguf_families)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):  # only for the parameter names; costs no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    # NOTE: from_pretrained(gguf_file=...) would do the same but insists on `accelerate`.
    loaded = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    return config, tokenizer, skeleton, loaded["tensors"]


def _save_tokenizer(tokenizer, gguf_path: Path, dest: Path) -> None:
    """Save the tokenizer; take chat template and eos from the GGUF if transformers lost them."""
    if not getattr(tokenizer, "chat_template", None) or tokenizer.eos_token is None:
        metadata = _read_tokenizer_metadata(gguf_path)  # slow (seconds): only when needed
        if not getattr(tokenizer, "chat_template", None) and metadata.get("chat_template"):
            tokenizer.chat_template = metadata["chat_template"]
        if tokenizer.eos_token is None and metadata.get("eos_token_id") is not None:
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(metadata["eos_token_id"])
    if not getattr(tokenizer, "chat_template", None):
        logger.warning("%s has no chat template; chat APIs will be unavailable", gguf_path.name)
    tokenizer.save_pretrained(dest)


def _read_tokenizer_metadata(gguf_path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    fields = GGUFReader(gguf_path).fields
    out: dict[str, Any] = {}
    if (field := fields.get("tokenizer.chat_template")) is not None:
        out["chat_template"] = field.contents()
    if (field := fields.get("tokenizer.ggml.eos_token_id")) is not None:
        out["eos_token_id"] = int(field.contents())
    return out
