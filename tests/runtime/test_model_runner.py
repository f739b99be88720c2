"""ModelRunner's start-up refusals: a backend that cannot run on the device is refused before
the weights load, with a message that names the way out."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import make_tiny_model

from radixflow.runtime import model_runner
from radixflow.runtime.attention import check_backend_fits_device, create_attention_backend
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama")


def test_torch_native_on_cuda_is_refused_before_the_weights_load(tiny_llama, monkeypatch):
    monkeypatch.setattr(model_runner, "resolve_device", lambda name: torch.device("cuda"))

    def load_model(self, folder):
        raise AssertionError("the weights were loaded before the backend was checked")

    monkeypatch.setattr(ModelRunner, "_load_model", load_model)
    config = json.loads((tiny_llama / "config.json").read_text())
    args = ServerArgs(model=str(tiny_llama), attention_backend="torch_native")
    with pytest.raises(ValueError, match="torch_native runs on the CPU only.*triton"):
        ModelRunner(args, tiny_llama, config)


def test_the_check_refuses_only_torch_native_on_cuda():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    with pytest.raises(ValueError, match="--attention-backend triton or auto"):
        check_backend_fits_device("torch_native", cuda)
    with pytest.raises(ValueError, match="torch_native"):
        create_attention_backend("torch_native", cuda, 4, 2, 16, 0.25)
    for name, device in (("auto", cuda), ("triton", cuda), ("torch_native", cpu),
                         ("auto", cpu), ("triton", cpu)):
        check_backend_fits_device(name, device)
