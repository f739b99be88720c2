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

    def load_model(*args, **kwargs):
        raise AssertionError("the weights were loaded before the backend was checked")

    monkeypatch.setattr(model_runner, "load_model", load_model)
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


@pytest.fixture(scope="module")
def long_context_llama(tmp_path_factory):
    """A tiny Llama that claims Llama 3.2's context, 131,072 tokens."""
    return make_tiny_model(tmp_path_factory.mktemp("long-llama"), "llama",
                           max_position_embeddings=131072)


def test_the_kv_pool_is_sized_by_its_flags_not_the_models_context(long_context_llama, caplog):
    config = json.loads((long_context_llama / "config.json").read_text())
    runner = ModelRunner(ServerArgs(model=str(long_context_llama), max_total_tokens=1024),
                         long_context_llama, config)
    assert runner.kv_pool.num_slots == 1024 and runner.context_len == 1024
    assert runner.req_to_token_pool.req_to_token.shape[1] == 1024
    assert "requests are limited to 1024 tokens" in caplog.text
    per_token = runner.kv_pool.bytes_per_token(
        config["num_hidden_layers"], config["num_key_value_heads"],
        config["hidden_size"] // config["num_attention_heads"], runner.kv_dtype)
    by_budget = ModelRunner(ServerArgs(model=str(long_context_llama), kv_cache_gb=0.001),
                            long_context_llama, config)
    assert by_budget.kv_pool.num_slots == int(0.001 * 2**30 // per_token) < 131072
    assert by_budget.context_len == by_budget.kv_pool.num_slots


def test_a_context_length_asked_for_must_fit_the_pool(long_context_llama):
    config = json.loads((long_context_llama / "config.json").read_text())
    args = ServerArgs(model=str(long_context_llama), max_total_tokens=1024, context_length=4096)
    with pytest.raises(ValueError, match="--context-length 4096 does not fit the KV pool of "
                                         "1024 tokens.*--kv-cache-gb"):
        ModelRunner(args, long_context_llama, config)
    fits = ModelRunner(ServerArgs(model=str(long_context_llama), max_total_tokens=1024,
                                  context_length=512), long_context_llama, config)
    assert fits.context_len == 512


def test_the_kv_pool_never_takes_more_than_the_memory_left(long_context_llama, monkeypatch,
                                                          caplog):
    """The default pool shrinks to what is free after the weights, with a warning; a size
    asked for that does not fit is refused, naming what is free (never a swapping machine)."""
    from radixflow.runtime import host_memory

    config = json.loads((long_context_llama / "config.json").read_text())
    monkeypatch.setattr(host_memory, "room_for_kv", lambda: 2**20)  # 1 MiB left
    default = ModelRunner(ServerArgs(model=str(long_context_llama)), long_context_llama, config)
    per_token = default.kv_pool.bytes_per_token(
        config["num_hidden_layers"], config["num_key_value_heads"],
        config["hidden_size"] // config["num_attention_heads"], default.kv_dtype)
    assert default.kv_pool.num_slots == 2**20 // per_token
    assert "the default KV pool of 1.00 GiB does not fit the memory left" in caplog.text
    for asked in ({"max_total_tokens": 100_000}, {"kv_cache_gb": 4.0}):
        with pytest.raises(ValueError, match=r"does not fit this machine's memory: 0.00 GiB "
                                             r"free for it after the weights.*--kv-cache-gb"):
            ModelRunner(ServerArgs(model=str(long_context_llama), **asked), long_context_llama,
                        config)
    fits = ModelRunner(ServerArgs(model=str(long_context_llama), max_total_tokens=64),
                       long_context_llama, config)
    assert fits.kv_pool.num_slots == 64


def test_room_for_kv_leaves_headroom(monkeypatch):
    from radixflow.runtime import host_memory

    assert host_memory.available_bytes() > 0  # Linux: /proc/meminfo's MemAvailable
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 10 * 2**30)
    assert host_memory.room_for_kv() == 8 * 2**30  # 10% and 1 GiB for the rest of the server
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**30)
    assert host_memory.room_for_kv() == 0
    monkeypatch.setattr(host_memory, "available_bytes", lambda: None)
    assert host_memory.room_for_kv() is None



def test_a_long_prefill_gives_its_freed_activations_back(tiny_llama, monkeypatch):
    """glibc keeps what a prefill's activations freed in its heap for good unless told: a CPU
    forward of RELEASE_AFTER_TOKENS tokens or more gives it back (malloc_trim), shorter ones
    (a decode step, a short suffix) do not pay for it."""
    from radixflow.runtime import host_memory
    from radixflow.runtime.forward_batch import BatchRequest, ForwardMode

    monkeypatch.setattr(host_memory, "RELEASE_AFTER_TOKENS", 24)
    config = json.loads((tiny_llama / "config.json").read_text())
    runner = ModelRunner(ServerArgs(model=str(tiny_llama), max_total_tokens=256), tiny_llama,
                         config)
    released = []
    monkeypatch.setattr(host_memory, "release_freed", lambda: released.append(True))
    for row, length, gives_back in ((0, 23, False), (1, 24, True)):
        slots = runner.kv_pool.alloc(length)
        runner.req_to_token_pool.req_to_token[row, :length] = slots.to(torch.int32)
        released.clear()
        runner.forward(ForwardMode.EXTEND, [BatchRequest(row, list(range(1, length + 1)), 0,
                                                         [length - 1])], slots)
        assert bool(released) == gives_back, length
