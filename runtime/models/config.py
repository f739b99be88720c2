"""ModelArgs: the few numbers a Llama-family forward needs, read from an HF config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from .rope_scaling import rope_settings

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArgs:
        archs = config.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise InvalidRequest(
                f"unsupported model architecture {arch!r}; supported: "
                f"{sorted(SUPPORTED_ARCHITECTURES)}", param="model")
        family = SUPPORTED_ARCHITECTURES[arch]
        num_heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // num_heads
        rope = rope_settings(config)  # rope_theta/rope_scaling or rope_parameters
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope.theta,
            rope_scaling=rope.scaling,
            max_position_embeddings=rope.max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(config.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            eos_token_ids=eos_ids,
        )
