"""Shared fixtures. Tiny random models are built per test session; the default model is
fetched (once, then cached) only by tests marked e2e."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_path():
    from radixflow.runtime.model_loader import resolve_model

    return resolve_model(None)
