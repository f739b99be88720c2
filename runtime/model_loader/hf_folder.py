"""Reading an HF model folder: config, tokenizer, safetensors weights."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelNotFound

if TYPE_CHECKING:
    import torch


def load_config(folder: Path) -> dict[str, Any]:
    """config.json of an HF folder, as a dict."""
    path = Path(folder) / "config.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as e:
        raise ModelNotFound(f"{path} does not exist; expected an HF model folder") from e
    except json.JSONDecodeError as e:
        raise ModelNotFound(f"{path} is not valid JSON: {e}") from e


def load_tokenizer(folder: Path):
    """The folder's fast (Rust `tokenizers`) tokenizer, read from local files only: the one
    transformers' AutoTokenizer gives (tokenizer_class.py: without importing torch once the
    folder's class is known)."""
    from .tokenizer_class import load_and_record, load_recorded

    try:
        tokenizer = (load_recorded(Path(folder), local_files_only=True)
                     or load_and_record(Path(folder), local_files_only=True))
    except (OSError, ValueError) as e:
        raise ModelNotFound(f"cannot load a tokenizer from {folder}: {e}") from e
    if not tokenizer.is_fast:
        raise ModelNotFound(f"{folder} has no fast tokenizer (tokenizer.json); radixflow needs one")
    # Prompts are held to the served context length (--context-length, a 400 naming it);
    # transformers' "longer than the specified maximum sequence length ... will result in
    # indexing errors" warning, once per process, would only mislead whoever reads the log.
    tokenizer.model_max_length = sys.maxsize
    return tokenizer


def safetensors_files(folder: Path) -> list[Path]:
    """The folder's weight shards, in the order the shard index lists them."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in dict.fromkeys(weight_map.values())]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder} holds no *.safetensors weights")
    return files


def iter_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of every safetensors shard, under its HF name, one at a time (CPU); for a
    folder prepared from a GGUF (gguf.json), its tensors dequantized to float32."""
    from safetensors import safe_open

    from .gguf_tensors import GGUFWeights

    if (source := GGUFWeights.of_folder(folder)) is not None:
        yield from source.dequantized()
        return

    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt") as f:
            names = f.keys()  # safe_open has keys() but is not iterable itself
            for name in names:
                yield name, f.get_tensor(name)


def transformers_model(folder: Path, dtype=None):
    """The folder's model as transformers builds it (the reference radixflow is checked
    against), for a folder of safetensors or one prepared from a GGUF (weights dequantized
    from the file)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .cache import SOURCE_FILE

    dtype = dtype or torch.float32
    if not (Path(folder) / SOURCE_FILE).is_file():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = dict(iter_weights(folder))
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()
