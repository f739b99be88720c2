"""The two shapes of a schema refusal, so every message names its keyword and JSON path."""

from __future__ import annotations

from ..errors import GrammarError


def unsupported(keyword: str, path: str, what: str) -> GrammarError:
    """A keyword (`what` describes it) that constrained decoding cannot enforce."""
    return GrammarError(f"json_schema uses {what} ('{keyword}' at {path}/{keyword}), which "
                        "constrained decoding cannot enforce", param="json_schema")


def refuse(keyword: str, path: str, why: str) -> GrammarError:
    """A keyword refused where it stands, for the reason `why`."""
    return GrammarError(f"json_schema: '{keyword}' at {path}/{keyword} {why}",
                        param="json_schema")
