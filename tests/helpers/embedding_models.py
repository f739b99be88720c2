"""Tiny random embedding models for the embedding tests, and their references.

`make_embedding_model(dest, pooling)` writes a tiny Llama folder (tiny_models.make_tiny_model)
and, for pooling "mean" / "cls" / "last", a sentence-transformers pipeline around it
(modules.json: Transformer, Pooling, Normalize); pooling None leaves it a bare folder, which
radixflow pools Qwen3-Embedding-style (last token, normalised). `reference_hidden` gives
transformers' final hidden states (AutoModel, the base model: final norm, no head), from which
a test computes what every pooling should give.
"""

from __future__ import annotations

import json
from pathlib import Path

from helpers.tiny_models import make_tiny_model

MODES = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token",
         "last": "pooling_mode_lasttoken"}
_ST = "sentence_transformers.models."


def make_embedding_model(dest: Path, pooling: str | None, *, normalize: bool = True,
                         seed: int = 3, **config) -> Path:
    folder = make_tiny_model(Path(dest), "llama", seed=seed, **config)
    if pooling is None:
        return folder
    modules = [{"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": _ST + "Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": _ST + "Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    flags = {key: key == MODES[pooling] for key in (*MODES.values(), "pooling_mode_max_tokens")}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "include_prompt": True, **flags}))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": 512, "do_lower_case": False}))
    return folder


def reference_hidden(folder: Path, ids_list: list[list[int]]) -> list:
    """transformers' last_hidden_state of each input (float32, one at a time: no padding)."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([ids])).last_hidden_state[0] for ids in ids_list]


def pooled(hidden, pooling: str, *, normalize: bool = True, dimensions: int | None = None):
    """What an input of final hidden states `hidden` [tokens, hidden] should embed to."""
    import torch.nn.functional as F

    vector = {"mean": hidden.mean(0), "cls": hidden[0], "last": hidden[-1]}[pooling]
    if dimensions is not None:
        vector = vector[:dimensions]
    return F.normalize(vector, dim=0) if normalize else vector
