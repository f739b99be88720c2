"""TokenizerLoad: the HTTP process's tokenizer, loaded while the model loads, from the class
the scheduler records on a folder's first start."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import ModelNotFound
from radixflow.runtime.model_loader import tokenizer_class
from radixflow.runtime.server.tokenizer_load import TokenizerLoad


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tokenizer folder, nothing recorded (a cache of this test's own)."""
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "cache"))
    make_tiny_tokenizer().save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_it_loads_the_class_once_another_process_records_it(folder):
    load = TokenizerLoad(str(folder))
    time.sleep(0.2)
    assert load._tokenizer is None and load._thread.is_alive()  # waiting for the record
    tokenizer_class.load_and_record(folder)  # what the scheduler does while it loads
    load._thread.join(30)
    assert load._tokenizer is not None  # loaded by the thread, before result()
    assert load.result()("hello world").input_ids == \
        tokenizer_class.load_recorded(folder)("hello world").input_ids


def test_without_a_record_result_asks_autotokenizer(folder):
    load = TokenizerLoad(str(folder))
    tokenizer = load.result()  # (a scheduler that records nothing)
    assert tokenizer.is_fast and not load._thread.is_alive()
    assert tokenizer_class.is_recorded(folder)


def test_a_broken_tokenizer_raises_from_result(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "cache"))
    (tmp_path / "empty").mkdir()
    load = TokenizerLoad(str(tmp_path / "empty"))
    with pytest.raises(ModelNotFound, match="empty"):
        load.result()


def test_cancel_stops_the_wait(folder):
    load = TokenizerLoad(str(folder))
    stopped = threading.Event()
    threading.Thread(target=lambda: (load.cancel(), stopped.set())).start()
    assert stopped.wait(5) and not load._thread.is_alive() and load._tokenizer is None
