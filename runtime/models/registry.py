"""The model class of each family (the one place that knows them all, so llama.py and the
family files need not import each other)."""

from __future__ import annotations

from .config import ModelArgs
from .gemma import GemmaForCausalLM
from .llama import LlamaForCausalLM


def model_class(args: ModelArgs) -> type[LlamaForCausalLM]:
    """The single-device model class of args' family."""
    if args.family in ("gemma2", "gemma3"):
        return GemmaForCausalLM
    return LlamaForCausalLM
