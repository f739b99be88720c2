"""Architecture support is visible: docs/models.md has one row per SUPPORTED_ARCHITECTURES
entry (a family added without its row fails here), `radixflow serve --help` and the README
point to it, and an architecture radixflow does not load is a one-line start-up error naming
it and the ones it loads."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from radixflow.runtime.errors import ModelNotFound
from radixflow.runtime.model_loader.gguf_families import HF_FOLDER_ONLY
from radixflow.runtime.models.config import SUPPORTED_ARCHITECTURES

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "models.md"
COLUMNS = ["architecture (`config.json`)", "family", "tensor parallel", "C decode step (CPU)",
           "GGUF", "quantized", "GPU"]


def table() -> list[dict[str, str]]:
    """The rows of the families table (the one after the marker comment)."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("<!-- families"))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    header, _, *body = rows
    assert header == COLUMNS
    return [dict(zip(header, row, strict=True)) for row in body]


def test_one_row_per_supported_architecture():
    rows = {re.fullmatch(r"`(\w+)`", row[COLUMNS[0]]).group(1): row for row in table()}
    missing = sorted(set(SUPPORTED_ARCHITECTURES) - set(rows))
    extra = sorted(set(rows) - set(SUPPORTED_ARCHITECTURES))
    assert not missing, f"docs/models.md has no row for {missing}: add one per family"
    assert not extra, f"docs/models.md lists {extra}, which radixflow does not load"
    for arch, row in rows.items():
        family = SUPPORTED_ARCHITECTURES[arch]
        assert row["family"] == family, arch
        assert all(row[c] for c in COLUMNS), f"{arch}: every column says something"
        # a family transformers cannot read from llama.cpp's files says so
        assert row["GGUF"].startswith("no") == (family in HF_FOLDER_ONLY), arch


def test_help_and_readme_point_to_the_table():
    from radixflow.runtime.cli import build_parser

    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    assert "docs/models.md" in serve.format_help()
    assert "docs/models.md" in (ROOT / "README.md").read_text()


@pytest.fixture
def gpt2_folder(tmp_path):
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 64,
              "n_embd": 32, "n_layer": 2, "n_head": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")  # never read: refused before
    return tmp_path


def test_unsupported_architecture_names_it_and_the_supported(gpt2_folder):
    from radixflow.runtime.model_loader import resolve_model

    with pytest.raises(ModelNotFound) as info:
        resolve_model(str(gpt2_folder))
    message = str(info.value)
    assert "GPT2LMHeadModel" in message and "docs/models.md" in message
    assert all(arch in message for arch in SUPPORTED_ARCHITECTURES)


def test_serve_refuses_it_at_start_up_in_one_line(gpt2_folder):
    proc = subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", "serve",
                           str(gpt2_folder), "--port", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output
    (line,) = [line for line in output.splitlines() if "GPT2LMHeadModel" in line]
    assert "unsupported model architecture" in line
    assert all(arch in line for arch in SUPPORTED_ARCHITECTURES)
