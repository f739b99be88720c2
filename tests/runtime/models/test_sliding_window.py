"""Sliding-window attention of the Llama-block families (families.py's window_fields): which
layers attend through a window, as transformers' configs and masks pick them; and tiny random
windowed Mistral, Qwen2 (windowed and full layers) and Phi-3 served past their windows of 8
through radixflow.Engine, greedy output token-identical to transformers in fp32 and prompt
logprobs within 1e-4: on the torch_native backend, under tensor parallelism and through the
compiled decode step. (The C decode step's windows: test_sliding_window_cpu_decode.py.)"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from helpers.family_models import (
    COMMON,
    FAMILIES,
    NEW_TOKENS,
    PROMPTS,
    check_engine_matches,
    hf_reference,
    make_family_model,
)

from radixflow.runtime.engine import Engine
from radixflow.runtime.models.config import ModelArgs

MOE = {k: FAMILIES[k][1] for k in ("mixtral", "qwen3_moe", "qwen2_moe")}

# (transformers config class, config.json fields beyond COMMON)
CONFIGS = {
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "mistral, null window": ("MistralConfig", dict(sliding_window=None)),
    "mistral, no window key (4096)": ("MistralConfig", dict()),
    "phi3": ("Phi3Config", dict(sliding_window=8)),
    "phi3, no window": ("Phi3Config", dict()),
    "mixtral": ("MixtralConfig", dict(MOE["mixtral"], sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8,
                                  max_window_layers=1)),
    "qwen2, flag off": ("Qwen2Config", dict(sliding_window=8, max_window_layers=0)),
    "qwen2, default max_window_layers 28": ("Qwen2Config", dict(
        use_sliding_window=True, sliding_window=8, num_hidden_layers=30)),
    "qwen2, layer_types": ("Qwen2Config", dict(
        use_sliding_window=True, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"])),
    "qwen3": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=8,
                                  max_window_layers=1)),
    "qwen3_moe (every layer)": ("Qwen3MoeConfig", dict(
        MOE["qwen3_moe"], use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen2_moe (even layers below max_window_layers)": ("Qwen2MoeConfig", dict(
        MOE["qwen2_moe"], use_sliding_window=True, sliding_window=8, max_window_layers=3,
        num_hidden_layers=4)),
    "smollm3 (NoPE layers)": ("SmolLM3Config", dict(
        use_sliding_window=True, sliding_window=8, no_rope_layer_interval=2)),
    "llama (reads no window)": ("LlamaConfig", dict(sliding_window=8)),
}


def _hf_layer_windows(config) -> list[int | None]:
    """Each layer's window as transformers' models apply it: Mistral, Mixtral, Phi-3 and
    Qwen3-MoE mask every layer by config.sliding_window; the others each layer by its
    layer_types entry (Llama: none)."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or None
    if config.model_type == "llama":
        return [None] * n
    if config.model_type in ("mistral", "mixtral", "phi3", "qwen3_moe"):
        return [window] * n
    return [window if t == "sliding_attention" else None for t in config.layer_types]


@pytest.mark.parametrize("case", list(CONFIGS))
def test_layer_windows_follow_transformers(case):
    config_cls, fields = CONFIGS[case]
    raw = {**COMMON, "vocab_size": 300, **fields,
           "architectures": [config_cls.replace("Config", "ForCausalLM")]}
    hf = _hf_layer_windows(getattr(transformers, config_cls)(**raw))
    args = ModelArgs.from_hf_config(raw)
    assert [args.layer_window(i) for i in range(args.num_layers)] == hf
    assert any(hf) or case.startswith(("mistral, null", "phi3, no", "qwen2, flag", "llama"))
    # transformers >= 5 writes layer_types into config.json: the same layers from them
    saved = getattr(transformers, config_cls)(**raw).to_dict()
    args = ModelArgs.from_hf_config({**saved, "architectures": raw["architectures"]})
    assert [args.layer_window(i) for i in range(args.num_layers)] == hf


def test_a_window_no_longer_caps_the_context(tmp_path):
    folder, _, _ = make_family_model(tmp_path, "mistral", sliding_window=4)
    with Engine(str(folder), dtype="float32", max_total_tokens=1024) as engine:
        assert engine.scheduler.runner.context_len == COMMON["max_position_embeddings"]


def _full_attention_logprobs(model, tok, prompt=PROMPTS[1]) -> torch.Tensor:
    """transformers' prompt logprobs of `model` with its window widened past the prompt."""
    wide = copy.deepcopy(model)
    wide.config.sliding_window = 10_000  # (the masks read it at each forward)
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = torch.log_softmax(wide(ids).logits[0, :-1].float(), -1)
    return ref.gather(1, ids[0, 1:, None]).squeeze(1)


WINDOWED = {"mistral": {}, "qwen2": {}, "phi3": dict(sliding_window=8)}  # Phi-3's partial rotary


def windowed_model(dest, family: str, **overrides):
    """make_family_model's folder and model, and the tokenizer as the engine loads it from the
    folder (a qwen2 folder gets Qwen2Tokenizer, which splits digits)."""
    folder, model, _ = make_family_model(dest, family, **{**WINDOWED[family], **overrides})
    return folder, model, transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("family", list(WINDOWED))
def test_windowed_family_matches_hf(tmp_path, family):
    """Prompts of 9 to 50 tokens and 16 new ones, a window of 8, prefill in chunks of 7 and
    decode batches of three (torch_native's windowed extend and decode plans)."""
    folder, model, tok = windowed_model(tmp_path, family)
    _, windowed = hf_reference(model, tok, [])
    assert (windowed - _full_attention_logprobs(model, tok)).abs().max() > 1e-2  # it bites
    check_engine_matches(folder, model, tok, attention_backend="torch_native")


def test_windowed_tp2_matches_hf(tmp_path):
    """Each rank's attention passes its layers' windows (a rank's is Llama's Attention)."""
    folder, model, tok = windowed_model(tmp_path, "qwen2")
    check_engine_matches(folder, model, tok, tp_size=2)


def test_windowed_compiled_decode_matches_hf(tmp_path):
    """--enable-torch-compile's decode step masks a windowed layer's keys to its window."""
    folder, model, tok = windowed_model(tmp_path, "qwen2")
    prompt = PROMPTS[1]  # 25 tokens, then 16 more: past the window of 8 throughout
    expected, _ = hf_reference(model, tok, [prompt])
    with Engine(str(folder), dtype="float32", max_total_tokens=512,
                enable_torch_compile=True) as engine:
        out = engine.generate(prompt, {"max_new_tokens": NEW_TOKENS, "temperature": 0,
                                       "ignore_eos": True})
        assert engine.scheduler.runner.compiled_decode.calls == NEW_TOKENS - 1
    assert out["output_ids"] == expected[0]
