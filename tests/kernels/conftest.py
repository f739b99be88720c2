"""Kernel tests run the Triton kernels on the CPU through the interpreter.

NOTE: triton decides at @triton.jit time whether a kernel is interpreted, so the variable must
be set before any radixflow.kernels.triton module is imported.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
