"""The operator's live view: /dashboard (the page) and the JSON it polls."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
