"""Backends over one tiny random model: the in-process Engine and a live `radixflow serve`."""

from __future__ import annotations

import pytest
from helpers.tiny_models import make_tiny_model

import radixflow as rf

ENGINE_ARGS = dict(dtype="float32", max_total_tokens=4096, max_running_requests=16)


@pytest.fixture(scope="session")
def lang_tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("lang-tiny"), "llama")


@pytest.fixture(scope="session")
def engine_backend(lang_tiny_model):
    backend = rf.Engine(str(lang_tiny_model), **ENGINE_ARGS)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def server_backend(lang_tiny_model):
    backend = rf.Runtime(str(lang_tiny_model), log_level="warning", start_timeout=300,
                         **ENGINE_ARGS)
    yield backend
    backend.shutdown()


@pytest.fixture(params=["engine", "server"])
def backend(request):
    """The program suite runs once per backend."""
    return request.getfixturevalue(f"{request.param}_backend")
