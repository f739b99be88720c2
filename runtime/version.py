"""radixflow's version, as the installed package's metadata states it (pyproject.toml)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("radixflow")
except PackageNotFoundError:  # running from a source tree that is not installed
    VERSION = "0+unknown"
