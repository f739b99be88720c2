"""load_tokenizer remembers the class AutoTokenizer picked for a folder and later loads through
it without importing torch; what it gives is AutoTokenizer's tokenizer, for the default model,
real tokenizers of three families and a tiny model's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.test_assets import tiny_model_dir, tokenizer_dir

from radixflow.runtime.model_loader import tokenizer_class
from radixflow.runtime.model_loader.hf_folder import load_tokenizer

TEXTS = ["Hello, world! The café costs 3.50 €.", "  leading spaces\nand\ttabs  ",
         "def f(x):\n    return x ** 2  # 数学", ""]
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "4."},
            {"role": "user", "content": "And 3 + 3?"}]


@pytest.fixture(scope="module")
def folders(default_model_path) -> list[Path]:
    """Resolved in the usual cache (the test assets are fetched and built once there)."""
    return [Path(default_model_path), tokenizer_dir("qwen3"), tokenizer_dir("llama3"),
            tokenizer_dir("mistral"), tiny_model_dir("qwen3", "qwen3", "Qwen3-Coder")]


@pytest.fixture
def own_cache(folders, tmp_path, monkeypatch):
    """The records go to an empty cache of this test's."""
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizer-classes"


def _same(a, b) -> None:
    assert type(a) is type(b)
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert a.init_kwargs == b.init_kwargs
    assert a.special_tokens_map == b.special_tokens_map
    assert a.added_tokens_decoder == b.added_tokens_decoder
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (
        b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert a.chat_template == b.chat_template
    for text in TEXTS:
        assert a(text).input_ids == b(text).input_ids
        ids = a(text).input_ids
        assert a.decode(ids) == b.decode(ids)
    if a.chat_template:
        assert (a.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
                == b.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True))


def test_the_recorded_class_gives_autotokenizers_tokenizer(folders, own_cache):
    for folder in folders:
        assert tokenizer_class.load_recorded(folder) is None
        first = load_tokenizer(folder)  # through AutoTokenizer: records its class
        again = tokenizer_class.load_recorded(folder, local_files_only=True)
        assert again is not None, folder
        _same(again, first)
    assert len(list(own_cache.glob("*.json"))) == len(folders)


def test_a_recorded_folder_loads_without_torch(default_model_path, own_cache):
    load_tokenizer(Path(default_model_path))
    code = ("import sys; from radixflow.runtime.model_loader.hf_folder import load_tokenizer; "
            f"t = load_tokenizer({str(default_model_path)!r}); "
            "print(type(t).__name__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == [type(load_tokenizer(Path(default_model_path))).__name__, "False"]


def test_a_changed_folder_asks_autotokenizer_again(folders, tmp_path, own_cache):
    folder = tmp_path / "tok"
    folder.mkdir()
    for f in folders[1].iterdir():  # qwen3's
        (folder / f.name).write_bytes(f.read_bytes())
    load_tokenizer(folder)
    assert tokenizer_class.load_recorded(folder) is not None
    config = json.loads((folder / "tokenizer_config.json").read_text())
    side = "left" if config.get("padding_side", "right") == "right" else "right"
    config["padding_side"] = side
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_class.load_recorded(folder) is None  # the record no longer applies
    assert load_tokenizer(folder).padding_side == side
    assert tokenizer_class.load_recorded(folder).padding_side == side


def test_a_broken_record_falls_back(default_model_path, own_cache):
    folder = Path(default_model_path)
    load_tokenizer(folder)
    (record,) = own_cache.glob("*.json")
    record.write_text(json.dumps({"module": "transformers", "class": "NoSuchTokenizer"}))
    assert tokenizer_class.load_recorded(folder) is None
    assert type(load_tokenizer(folder)).__name__ == "TokenizersBackend"
    assert json.loads(record.read_text())["class"] == "TokenizersBackend"  # written anew
