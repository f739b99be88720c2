"""GGUF files that transformers' reader cannot read, read here: llama.cpp's `granite`,
`smollm3` and `olmoe` archs, and Mixtral (which llama.cpp writes as a `llama` file with
stacked experts).

The config is built from the GGUF metadata as llama.cpp names and reads it (src/models/*.cpp
and convert_hf_to_gguf.py) into the transformers config of the family (GraniteConfig,
SmolLM3Config, OlmoeConfig, MixtralConfig). The tensors are read memory-mapped with gguf's
GGUFReader and planned (tensor_plan; gguf_tensors.py reads them as stored), named as the
transformers model's names (gguf's HF -> GGUF name map, applied to the model's names), with
llama.cpp's q/k row permutation undone where its converter applied it (LlamaModel and its
subclasses: llama / Mixtral, granite, smollm3; not olmoe) and the stacked experts
(`blk.N.ffn_{gate,up,down}_exps`) put in transformers' stacked layout
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]). The tokenizer is
transformers' own GGUF tokenizer builder, which does not depend on the arch
(`TokenizersBackend.from_pretrained(..., gguf_file=...)`, what AutoTokenizer uses once it has
a config).

What llama.cpp fixes and the file does not say:
- smollm3: every 4th layer (3, 7, ...) has no RoPE (`n_no_rope_layer_step = 4`);
- granite: without `attention.scale` the softmax scale is 1/sqrt(head_dim) (transformers'
  attention_multiplier default is 1.0); without `embedding_scale` / `residual_scale`, 1;
- olmoe: the top-k weights are not renormalised (norm_topk_prob False), and its converter
  writes no clip_qkv (read from `olmoe.attention.clamp_kqv` where a file has it);
- Mixtral: the top-k weights are renormalised (MixtralConfig always does); no window
  (llama.cpp's llama graph attends in full).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

OWN_ARCHS = ("granite", "smollm3", "olmoe")
# llama.cpp's converter permutes q/k rows (LlamaModel.permute) for these; olmoe is a TextModel
_PERMUTED = ("llama", "granite", "smollm3")
_CONFIGS = {"llama": "MixtralConfig", "granite": "GraniteConfig",
            "smollm3": "SmolLM3Config", "olmoe": "OlmoeConfig"}
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp's hparams.n_no_rope_layer_step for smollm3


def reads_itself(gguf_path: Path) -> bool:
    """Whether `gguf_path` is a file this module reads (and transformers' reader does not)."""
    from .gguf_tensors import gguf_reader

    fields = gguf_reader(gguf_path).fields
    arch = _contents(fields, "general.architecture")
    return arch in OWN_ARCHS or (arch == "llama"
                                 and bool(_contents(fields, "llama.expert_count")))


def read_gguf(gguf_path: Path):
    """(config, tokenizer, skeleton, plan) for `gguf_path`: the transformers config, its
    tokenizer, the model on the meta device (for its parameter names) and the tensor plan
    (`tensor_plan`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from .gguf_tensors import gguf_reader

    reader = gguf_reader(gguf_path)
    arch = _contents(reader.fields, "general.architecture")
    config = _config(reader, arch)
    with torch.device("meta"):  # only for the parameter names; costs no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    plan = tensor_plan(reader, arch, config, skeleton)
    return config, _tokenizer(gguf_path), skeleton, plan


def _contents(fields, key: str):
    field = fields.get(key)
    return None if field is None else field.contents()


def _config(reader, arch: str):
    import transformers

    fields = reader.fields
    names = {t.name for t in reader.tensors}

    def key(name: str, default=None):
        value = _contents(fields, f"{arch}.{name}")
        return default if value is None else value

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // heads))
    vocab = key("vocab_size") or len(_contents(fields, "tokenizer.ggml.tokens"))
    special = {name: _contents(fields, f"tokenizer.ggml.{key_}") for name, key_ in (
        ("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"))}
    kwargs: dict[str, Any] = dict(
        vocab_size=int(vocab), hidden_size=hidden, num_hidden_layers=int(key("block_count")),
        intermediate_size=int(key("feed_forward_length")), num_attention_heads=heads,
        num_key_value_heads=int(key("attention.head_count_kv", heads)),
        max_position_embeddings=int(key("context_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
        **{k: None if v is None else int(v) for k, v in special.items()})
    if arch != "granite":  # (llama.cpp's granite has no head_dim: hidden / heads)
        kwargs["head_dim"] = head_dim
    if arch == "granite":
        kwargs.update(
            attention_multiplier=float(key("attention.scale", 0.0)) or 1 / math.sqrt(head_dim),
            embedding_multiplier=float(key("embedding_scale", 0.0)) or 1.0,
            residual_multiplier=float(key("residual_scale", 0.0)) or 1.0,
            logits_scaling=float(key("logit_scale", 1.0)),
            attention_bias="blk.0.attn_q.bias" in names, mlp_bias="blk.0.ffn_up.bias" in names)
    elif arch == "smollm3":
        kwargs.update(no_rope_layer_interval=SMOLLM3_NO_ROPE_STEP,
                      attention_bias="blk.0.attn_q.bias" in names)
    else:  # olmoe, or llama with experts (Mixtral)
        experts = int(key("expert_count"))
        kwargs["intermediate_size"] = int(key("expert_feed_forward_length",
                                              kwargs["intermediate_size"]))
        kwargs["num_experts_per_tok"] = int(key("expert_used_count"))
        if arch == "olmoe":
            clip = key("attention.clamp_kqv")
            kwargs.update(num_experts=experts, norm_topk_prob=False,
                          clip_qkv=None if not clip else float(clip))
        else:
            kwargs.update(num_local_experts=experts, sliding_window=None)
    return getattr(transformers, _CONFIGS[arch])(**kwargs)


def tensor_plan(reader, arch: str, config, skeleton) -> dict[str, dict[str, Any]]:
    """For each tensor of the transformers model (`skeleton`'s names; no `lm_head.weight` when
    the head is tied): {"tensors": the GGUF tensors that make it, "shape": its shape,
    "unpermute": heads, where llama.cpp's converter permuted its rows, "stack":
    "experts_gate_up" where gate and up experts are stacked as one}; gguf_tensors reads it."""
    import gguf

    infos = {t.name: t for t in reader.tensors}
    left = set(infos)

    def take(name: str) -> str:
        if name not in infos:
            raise KeyError(f"the file has no tensor {name!r}")
        left.discard(name)
        return name

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config.num_hidden_layers)
    plan: dict[str, dict[str, Any]] = {}
    for hf_name, param in skeleton.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        entry: dict[str, Any] = {"shape": list(param.shape)}
        stem, _, last = hf_name.rpartition(".")
        if stem.endswith(".experts") and last in ("gate_up_proj", "down_proj"):
            layer = hf_name.split(".")[2]
            if last == "gate_up_proj":  # [E, I, H] each -> [E, 2I, H]
                entry.update(tensors=[take(f"blk.{layer}.ffn_gate_exps.weight"),
                                      take(f"blk.{layer}.ffn_up_exps.weight")],
                             stack="experts_gate_up")
            else:
                entry["tensors"] = [take(f"blk.{layer}.ffn_down_exps.weight")]
            plan[hf_name] = entry
            continue
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise KeyError(f"no GGUF name for {hf_name!r} in llama.cpp's {arch} arch")
        entry["tensors"] = [take(gguf_name)]
        if arch in _PERMUTED and stem.endswith(("q_proj", "k_proj")):
            entry["unpermute"] = (config.num_attention_heads if stem.endswith("q_proj")
                                  else config.num_key_value_heads)
        plan[hf_name] = entry
    # (llama.cpp may add tensors it computes, rope_freqs: not weights of the model)
    left -= {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"}
    if left:
        raise KeyError(f"tensors the {type(skeleton).__name__} config has no place for: "
                       f"{sorted(left)[:5]}")
    return plan


def _tokenizer(gguf_path: Path):
    """transformers' tokenizer from the GGUF's tokenizer metadata (any arch: the builder is
    picked by `tokenizer.ggml.model`)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(gguf_path.parent),
                                                   gguf_file=gguf_path.name)
