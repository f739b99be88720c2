"""The constrained-decoding corpus in tests/data: JSON Schemas, regexes, EBNF grammars."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def load_schemas() -> list[tuple[str, dict]]:
    """The schemas constrained decoding enforces, each with a description and examples."""
    return [(path.stem, json.loads(path.read_text()))
            for path in sorted((DATA / "json_schemas").glob("*.json"))]


def load_refused_schemas() -> list[tuple[str, dict]]:
    """Schemas that must be refused: {"description", "schema", "refused": {"keyword", "path"}}
    and, where xgrammar compiles the schema as it is, a "counterexample": a JSON text its masks
    accept that fails validation."""
    return [(path.stem, json.loads(path.read_text()))
            for path in sorted((DATA / "json_schemas" / "refused").glob("*.json"))]


def load_regexes() -> list[dict]:
    return json.loads((DATA / "regexes.json").read_text())


def load_grammars() -> list[tuple[str, str]]:
    return [(path.stem, path.read_text()) for path in sorted((DATA / "grammars").glob("*.ebnf"))]
