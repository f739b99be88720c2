from __future__ import annotations

import pytest
from helpers.tiny_models import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """make(arch) -> folder of a tiny random model, built once per arch per session."""
    cache: dict[str, object] = {}

    def make(arch: str = "llama"):
        if arch not in cache:
            cache[arch] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return cache[arch]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory):
    return tiny_model_factory("llama")
