"""Preparing a GGUF's folder parses its header once (transformers' config and tokenizer readers
share it), with a reader that gives exactly what gguf's GGUFReader gives."""

from __future__ import annotations

import numpy as np
from helpers.tiny_models import make_tiny_model, write_tiny_gguf

from radixflow.runtime.model_loader import resolve_model
from radixflow.runtime.model_loader.gguf_tensors import _fast_reader_class


def test_the_fast_reader_reads_what_gguf_reads(tmp_path):
    import gguf

    path = write_tiny_gguf(make_tiny_model(tmp_path / "hf", "llama"), tmp_path / "m.gguf",
                           qtype_of=lambda n: gguf.GGMLQuantizationType.Q8_0
                           if n.endswith("proj.weight") else None)
    theirs, ours = gguf.GGUFReader(path), _fast_reader_class()(path)
    assert list(ours.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        mine = ours.fields[name]
        assert (mine.offset, mine.data, mine.types) == (field.offset, field.data, field.types)
        assert len(mine.parts) == len(field.parts)
        for a, b in zip(mine.parts, field.parts, strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        assert mine.contents() == field.contents()
    assert len(ours.tensors) == len(theirs.tensors)
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, a.data_offset, a.n_bytes) == (
            b.name, b.tensor_type, b.data_offset, b.n_bytes)
        assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data)


def test_preparing_a_gguf_parses_its_header_once(tmp_path, monkeypatch):
    import gguf

    path = write_tiny_gguf(make_tiny_model(tmp_path / "hf", "llama"), tmp_path / "m.gguf")
    parses = []
    init = gguf.GGUFReader.__init__

    def counted(self, *args, **kwargs):
        parses.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counted)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    assert (folder / "gguf.json").is_file() and (folder / "tokenizer.json").is_file()
    assert len(parses) == 1
    assert gguf.GGUFReader.__name__ == "GGUFReader"  # put back after the preparation


def test_the_server_prepares_a_new_gguf_in_a_child_process(tmp_path, monkeypatch):
    """`radixflow serve` prepares a GGUF it has not seen in a child process (transformers'
    GGUF reading never stays in the HTTP process); a prepared one resolves in place, and a
    bad file's error comes back from the child as it is."""
    import gguf
    import pytest

    from radixflow.runtime.errors import ModelNotFound
    from radixflow.runtime.model_loader import tokenizer_class
    from radixflow.runtime.model_loader.resolve import NotPrepared
    from radixflow.runtime.server.launch import model_folder

    monkeypatch.setenv("RADIXFLOW_CACHE", str(tmp_path / "cache"))
    path = write_tiny_gguf(make_tiny_model(tmp_path / "hf", "llama"), tmp_path / "m.gguf")
    with pytest.raises(NotPrepared):
        resolve_model(str(path), prepare=False)
    parses_here = []
    init = gguf.GGUFReader.__init__

    def counted(self, *args, **kwargs):
        parses_here.append(args)
        init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counted)  # (this process only)
    folder = model_folder(str(path))
    assert (folder / "gguf.json").is_file()
    assert parses_here == []  # the header was read in the child, not here
    assert tokenizer_class.is_recorded(folder)  # by the child: the scheduler skips AutoTokenizer
    assert resolve_model(str(path), prepare=False) == folder
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelNotFound, match="bad.gguf"):
        model_folder(str(bad))
