"""Batched sampling of one decode step: masks, penalties, temperature, top-k/top-p/min-p, seeds."""

from __future__ import annotations

from .batch import SamplingBatch
from .logprobs import compute_logprobs, top_logprobs
from .penalties import Penalties
from .sampler import SampleOutput, sample

__all__ = [
    "Penalties",
    "SampleOutput",
    "SamplingBatch",
    "compute_logprobs",
    "sample",
    "top_logprobs",
]
