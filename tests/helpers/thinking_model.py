"""A tiny random model that can think: Qwen3's real tokenizer (<think> 151667 and </think>
151668, plain added tokens as in Qwen3) and Qwen3-0.6B's published chat template, from
test_assets (llama.cpp's test files). A random model rarely writes a marker on its own, so the
tests drive it: greedy decoding, logit_bias to pick what it thinks, thinking_budget to end it.
"""

from __future__ import annotations

from pathlib import Path

QWEN3_TEMPLATE = "Qwen-Qwen3-0.6B"  # opens no thinking; enable_thinking=false closes it
R1_TEMPLATE = "llama-cpp-deepseek-r1"  # DeepSeek-R1's generation prompt: <｜Assistant｜><think>\n


def make_thinking_model(dest: Path) -> Path:
    from helpers.test_assets import load_tokenizer
    from helpers.tiny_models import make_tiny_model

    return make_tiny_model(dest, "qwen3", tokenizer=load_tokenizer("qwen3", QWEN3_TEMPLATE))


def render(tokenizer, content: str, *, template: str | None = None, **kwargs) -> str:
    """One user turn and the generation prompt, with the model's template or `template`."""
    from helpers.test_assets import template as template_text

    chat_template = template_text(template) if template else None
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True,
                                         chat_template=chat_template, **kwargs)
