"""Batched sampling of one decode step: penalties, temperature, top-k/top-p/min-p, seeds."""

from __future__ import annotations

from .batch import SamplingBatch
from .logprobs import compute_logprobs, top_logprobs
from .penalties import Penalties
from .sampler import SampleOutput, apply_vocab_mask, sample, unpack_bitmask

__all__ = [
    "Penalties",
    "SampleOutput",
    "SamplingBatch",
    "apply_vocab_mask",
    "compute_logprobs",
    "sample",
    "top_logprobs",
    "unpack_bitmask",
]
