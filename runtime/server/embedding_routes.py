"""Embeddings: /v1/embeddings (OpenAI) and /encode (SGLang), on a --is-embedding server."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
