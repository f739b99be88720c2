"""GGUF file -> a model folder: the config and tokenizer (with its chat template) through
transformers' own GGUF reader, or for the files it cannot read (llama.cpp's granite, smollm3,
olmoe and Mixtral files) gguf_own_reader.py.

The weights stay in the GGUF for the archs in AS_STORED (gguf_tensors.py reads them at each
load, in their own quantization); for the others, transformers' reader dequantizes them and
undoes llama.cpp's permutations, and they are saved as float32 safetensors (lossless for
dequantized blocks).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from ..errors import ModelNotFound
from ..models.rope_scaling import set_gguf_rope
from .gguf_families import fix_family_config, read_error_hint
from .gguf_own_reader import read_gguf, reads_itself, tensor_plan
from .gguf_tensors import forget_readers, write_source

logger = logging.getLogger(__name__)

_MAX_SHARD_SIZE = "4GB"


# archs whose tensors radixflow reads from the GGUF as stored, at every load (gguf_tensors);
# the others' are dequantized once into float32 safetensors (transformers' reader: phi3's,
# gemma's and the MoE families' tensor fixes are its own)
AS_STORED = ("llama", "qwen2", "qwen3", "granite", "smollm3", "olmoe")


def convert_gguf(gguf_path: Path, dest: Path, *, move_into: bool = False) -> dict[str, Any]:
    """Prepare the existing folder `dest` for `gguf_path`; returns a summary.

    For the archs in AS_STORED: the config, the tokenizer (from the GGUF's metadata) and
    gguf.json, which names the file and where each tensor of the model is in it; no weights
    are written (the model loads from the GGUF itself). For the others: an HF folder with
    the weights dequantized to float32 safetensors. `move_into`: the file moves into `dest`
    (the default model's, downloaded into a temporary folder).

    Raises ModelNotFound when the file cannot be read (not a GGUF, or an architecture
    transformers' reader does not know).
    """
    import torch
    from transformers import GenerationConfig

    start = time.monotonic()
    try:
        if reads_itself(gguf_path):  # granite, smollm3, olmoe, Mixtral (gguf_own_reader)
            config, tokenizer, skeleton, plan = read_gguf(gguf_path)
            tensors = None
        else:
            config, tokenizer, skeleton, plan, tensors = _read_with_transformers(gguf_path)
        set_gguf_rope(config, gguf_path)  # rope scaling, which the reader drops (rope_scaling)
    except (ValueError, KeyError, OSError) as e:
        raise ModelNotFound(f"could not read {gguf_path} as a GGUF model: {e}"
                            f"{read_error_hint(e)}") from e

    # llama.cpp drops `output.weight` when the head is tied to the embedding.
    tied = "lm_head.weight" not in (plan if tensors is None else tensors)
    config.tie_word_embeddings = tied
    config.architectures = [type(skeleton).__name__]
    config.dtype = "float32"  # `torch_dtype` before transformers 5
    tokenizer.model_max_length = config.max_position_embeddings
    config.save_pretrained(dest)
    GenerationConfig.from_model_config(config).save_pretrained(dest)
    _save_tokenizer(tokenizer, gguf_path, dest)
    if tensors is None:
        if move_into:
            gguf_path = gguf_path.rename(dest / gguf_path.name)
        write_source(dest, gguf_path, plan, relative=move_into)
        stored = "as stored (gguf.json)"
    else:
        _save_float32(tensors, skeleton, gguf_path, dest, tied, torch)
        stored = "float32 safetensors"
    forget_readers()
    logger.info("prepared %s in %.1f s: weights %s", gguf_path.name,
                time.monotonic() - start, stored)
    return {
        "source": str(gguf_path),
        "architecture": config.architectures[0],
        "tie_word_embeddings": tied,
        "weights": stored,
    }


def _save_float32(tensors, skeleton, gguf_path: Path, dest: Path, tied: bool, torch) -> None:
    from huggingface_hub import save_torch_state_dict

    logger.info("dequantizing %s to float32 safetensors (once; may take a minute)",
                gguf_path.name)
    tensors = {k: v.to(torch.float32).contiguous() for k, v in tensors.items()}
    expected = set(skeleton.state_dict()) - ({"lm_head.weight"} if tied else set())
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ModelNotFound(
            f"{gguf_path} does not match its {type(skeleton).__name__} config: "
            f"missing {missing[:5]}, unexpected {extra[:5]}"
        )
    save_torch_state_dict(tensors, dest, max_shard_size=_MAX_SHARD_SIZE)


def _read_with_transformers(gguf_path: Path):
    """(config, tokenizer, skeleton, plan, None) through transformers' GGUF reader for the
    archs read as stored, (config, tokenizer, skeleton, None, float32 tensors) for others."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from .gguf_tensors import gguf_reader

    folder, name = str(gguf_path.parent), gguf_path.name
    with _one_parse_of(gguf_path):
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    fix_family_config(config, gguf_path)  # what the reader drops of phi3 (gguf_families)
    with torch.device("meta"):  # only for the parameter names; costs no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    reader = gguf_reader(gguf_path)
    arch = reader.fields["general.architecture"].contents()
    if arch in AS_STORED:
        return config, tokenizer, skeleton, tensor_plan(reader, arch, config, skeleton), None
    # NOTE: from_pretrained(gguf_file=...) would do the same but insists on `accelerate`.
    with _one_parse_of(gguf_path):
        loaded = load_gguf_checkpoint(str(gguf_path), return_tensors=True,
                                      model_to_load=skeleton)
    return config, tokenizer, skeleton, None, loaded["tensors"]


@contextlib.contextmanager
def _one_parse_of(gguf_path: Path):
    """transformers opens a new GGUFReader for the config, another for the tokenizer: each
    parses the header (2-3 s for a 128k vocabulary, its strings one by one). Within the block
    `gguf.GGUFReader` of this file is the shared reader (gguf_tensors.gguf_reader)."""
    import gguf

    from .gguf_tensors import gguf_reader

    reader_class = gguf.GGUFReader
    target = gguf_path.resolve()

    def shared(path, mode="r"):
        if mode == "r" and Path(path).resolve() == target:
            return gguf_reader(target)
        return reader_class(path, mode)

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = reader_class


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
    from .gguf_tensors import gguf_reader

    fields = gguf_reader(gguf_path).fields
    out: dict[str, Any] = {}
    if (field := fields.get("tokenizer.chat_template")) is not None:
        out["chat_template"] = field.contents()
    if (field := fields.get("tokenizer.ggml.eos_token_id")) is not None:
        out["eos_token_id"] = int(field.contents())
    return out
