"""model_building: what a start costs beyond loading the weights."""

from __future__ import annotations

import os
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


IMPORT_WATCH = """
import os, sys, traceback
class _Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("torch._dynamo", "sympy"):
            with open(os.path.join({out!r}, f"{{os.getpid()}}-{{name}}"), "w") as f:
                f.write(" ".join(sys.argv) + "\\n" + "".join(traceback.format_stack()))
        return None
sys.meta_path.insert(0, _Watch())
"""


def test_tensor_parallel_ranks_start_without_torch_dynamo(tmp_path, monkeypatch):
    """nn.Embedding's normal_ init on 'meta' goes through torch._refs, which imports
    torch._dynamo and sympy: 2-3 s of CPU in each rank, rank 0 (the scheduler) included, when
    the vocab-parallel embedding was built that way. Every process of a --tp-size 2 Engine,
    its start and first tokens, is watched by a sitecustomize that notes those imports."""
    monkeypatch.setenv("RADIXFLOW_CACHE", str(own_cache(tmp_path / "cache")))
    folder = make_tiny_model(tmp_path / "tiny", "llama")
    load_tokenizer(folder)
    (tmp_path / "watch").mkdir()
    (tmp_path / "marks").mkdir()
    (tmp_path / "watch" / "sitecustomize.py").write_text(
        IMPORT_WATCH.format(out=str(tmp_path / "marks")))
    code = ("from radixflow.runtime.engine import Engine; "
            f"e = Engine(model={str(folder)!r}, tp_size=2); "
            "print(len(e.generate('hi', {'max_new_tokens': 3})['output_ids'])); e.shutdown()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "watch"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["3"]
    marks = {m.name: m.read_text() for m in (tmp_path / "marks").iterdir()}
    assert not marks, "\n\n".join(f"{k}:\n{v[-2000:]}" for k, v in marks.items())
