"""OpenAI's Responses API: /v1/responses (create, stream, retrieve, cancel)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
