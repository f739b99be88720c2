"""Backends: where a program's gens and selects run."""

from __future__ import annotations

from .base import Backend
from .default import as_backend, get_default_backend, set_default_backend

__all__ = ["Backend", "as_backend", "get_default_backend", "set_default_backend"]
