"""Fixtures for the constrained-decoding tests: a grammar backend over the tiny tokenizer,
with a model vocab padded past the tokenizer's (as real models pad their logits)."""

from __future__ import annotations

import pytest

MODEL_VOCAB_SIZE = 544  # tiny tokenizer: 512 tokens + 3 specials; the rest is padding


@pytest.fixture(scope="session")
def tokenizer():
    from helpers.tiny_models import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def backend(tokenizer):
    from radixflow.runtime.constrained import GrammarBackend

    backend = GrammarBackend(tokenizer, MODEL_VOCAB_SIZE)
    yield backend
    backend.shutdown()
