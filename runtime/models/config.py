"""ModelArgs: the few numbers a Llama-family forward needs, read from an HF config.json.

SUPPORTED_ARCHITECTURES maps each HF architecture radixflow loads to its family; what a family
adds to the Llama blocks is read in families.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRequest
from .families import family_fields
from .rope_scaling import rope_settings

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GraniteForCausalLM": "granite",
    "SmolLM3ForCausalLM": "smollm3",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "MixtralForCausalLM": "mixtral",
    "OlmoeForCausalLM": "olmoe",
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
    # ---- beyond Llama (families.py); the defaults are Llama's ----
    o_proj_bias: bool = False
    mlp_bias: bool = False
    attention_multiplier: float | None = None  # softmax scale (Granite); None: head_dim ** -0.5
    embedding_multiplier: float = 1.0  # Granite
    residual_multiplier: float = 1.0  # Granite
    logits_scaling: float = 1.0  # Granite: logits / logits_scaling
    rotary_dim: int | None = None  # Phi-3's partial rotary; None: head_dim
    nope_layers: tuple[int, ...] = ()  # SmolLM3: layers without RoPE
    # sliding windows (families.py): the layers in window_layers attend through attn_window
    attn_window: int | None = None
    window_layers: tuple[int, ...] = ()
    # ---- Gemma (gemma.py) ----
    attn_softcap: float | None = None  # attention logits tanh-capped
    final_softcap: float | None = None  # output logits tanh-capped
    rope_local_theta: float | None = None  # Gemma 3's local (windowed) layers' RoPE base
    # ---- mixture of experts (moe.py) ----
    num_experts: int = 0  # routed experts of each sparse layer; 0: a dense model
    num_experts_per_tok: int = 0  # top_k
    moe_intermediate_size: int = 0  # each routed expert's
    norm_topk_prob: bool = False  # renormalise the top_k routing weights to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers of a MoE model with a dense MLP instead
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's sigmoid-gated shared expert
    qk_norm_per_head: bool = True  # False: OLMoE normalises the whole q / k projection
    clip_qkv: float | None = None  # OLMoE: q, k, v clamped to +-clip_qkv

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES.get(self.architecture, "llama")

    @property
    def attn_scale(self) -> float:
        """The softmax scale of every layer's attention."""
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return self.head_dim ** -0.5

    @property
    def rope_dim(self) -> int:
        """Dims of each head that rotate (the width of the cos/sin tables)."""
        return self.rotary_dim or self.head_dim

    def layer_is_moe(self, layer_id: int) -> bool:
        return self.num_experts > 0 and layer_id not in self.dense_layers

    def layer_has_rope(self, layer_id: int) -> bool:
        return layer_id not in self.nope_layers

    def layer_window(self, layer_id: int) -> int | None:
        """The sliding window layer `layer_id` attends through (None: all earlier tokens)."""
        return self.attn_window if layer_id in self.window_layers else None

    def fused_decode_gaps(self) -> list[str]:
        """What of this model the C decode step does not compute (empty: it computes all)."""
        gaps = []
        if self.residual_multiplier != 1.0:
            gaps.append(f"residual_multiplier {self.residual_multiplier}")
        if self.rope_dim != self.head_dim:
            gaps.append(f"partial rotary ({self.rope_dim} of {self.head_dim} dims)")
        if self.nope_layers:
            gaps.append(f"layers without RoPE {list(self.nope_layers)}")
        if self.o_proj_bias or self.mlp_bias:
            gaps.append("o_proj / MLP biases")
        if self.family in ("gemma2", "gemma3"):
            gaps.append("Gemma blocks (GeGLU, (1 + w) norms, soft-capping, windows)")
        if not self.qk_norm_per_head:
            gaps.append("q/k norms over the whole projection")
        if self.clip_qkv is not None:
            gaps.append("clip_qkv")
        return gaps

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
        num_layers = config["num_hidden_layers"]
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        fields = dict(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            intermediate_size=config["intermediate_size"],
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope.theta,
            rope_scaling=rope.scaling,
            max_position_embeddings=rope.max_positions,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=(family == "qwen2" or bool(config.get("attention_bias", False))
                      or (family == "qwen2_moe" and bool(config.get("qkv_bias", True)))),
            qk_norm=family in ("qwen3", "qwen3_moe", "olmoe"),
            eos_token_ids=eos_ids,
        )
        return cls(**{**fields, **family_fields(family, config, num_layers, head_dim)})
