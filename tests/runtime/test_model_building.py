"""model_building: what a start costs beyond loading the weights."""

from __future__ import annotations

import subprocess
import sys

import torch
from helpers.live_server import own_cache
from helpers.tiny_models import make_tiny_model

from radixflow.runtime.model_building import allocate_
from radixflow.runtime.model_loader import load_tokenizer


def test_allocate_gives_what_to_empty_gives():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
        model.register_buffer("table", torch.empty(3, 5).t())
    model[1].weight.requires_grad_(False)
    want = dict(model.named_parameters(), **dict(model.named_buffers()))
    allocate_(model, torch.device("cpu"))
    got = dict(model.named_parameters(), **dict(model.named_buffers()))
    assert got.keys() == want.keys()
    for name, t in got.items():
        w = want[name]
        assert (t.device.type, t.shape, t.stride(), t.dtype) == ("cpu", w.shape, w.stride(),
                                                                 w.dtype), name
        assert isinstance(t, torch.nn.Parameter) == isinstance(w, torch.nn.Parameter), name
        assert t.requires_grad == w.requires_grad, name


def test_a_start_and_its_first_tokens_import_no_sympy(tmp_path, monkeypatch):
    """torch's Python references (to_empty from 'meta' among them) import sympy: ~0.5-1 s of
    CPU in every scheduler's start, for nothing the CPU path runs. (The folder's tokenizer
    class recorded first, as after a server's first start: AutoTokenizer imports it.)"""
    monkeypatch.setenv("RADIXFLOW_CACHE", str(own_cache(tmp_path / "cache")))
    folder = make_tiny_model(tmp_path / "tiny", "llama")
    load_tokenizer(folder)
    code = ("import sys; from radixflow.runtime.engine import Engine; "
            f"e = Engine(model={str(folder)!r}); "
            "print(len(e.generate('hi', {'max_new_tokens': 3})['output_ids']), "
            "'sympy' in sys.modules); e.shutdown()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["3", "False"]
