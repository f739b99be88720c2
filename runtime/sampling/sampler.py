"""Batched sampling of one decode step's logits: the one function the scheduler calls.

Order (as in vLLM / SGLang): grammar mask and min_new_tokens bans, penalties, logit_bias (a
bias of -100 is -inf: the token is banned), then the draw:
temperature, top-k, top-p and min-p acting jointly on the temperature-scaled distribution
(semantics and algorithm: radixflow.kernels.sampling). An all-greedy batch takes the argmax
(kernels.cpu.argmax_rows on the CPU). The draw runs the sort-free Triton kernel on CUDA (CDF
inversion driven by uniforms) and the exponential race over the same kept set elsewhere
(kernels.sampling.sample_by_race_torch: robust to the logits' rounding, so a seeded request
keeps its tokens under another batching); a seeded row draws its uniforms or noise from its
own generator, so its tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.kernels.bitmask import apply_bitmask_
from radixflow.kernels.cpu import argmax_rows
from radixflow.kernels.dispatch import pick_backend
from radixflow.kernels.sampling import (
    DEFAULT_NUM_ROUNDS,
    SamplingBackend,
    sample_by_race_torch,
    sample_from_logits,
)

from .batch import SamplingBatch
from .logprobs import compute_logprobs, top_logprobs


@dataclass
class SampleOutput:
    next_ids: torch.Tensor  # [bs] int64
    logprobs: torch.Tensor | None  # [bs] float32: raw log_softmax at next_ids (None: not asked)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([bs, k] float32, [bs, k] int64)


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    *,
    bitmask: torch.Tensor | None = None,
    mask_rows: list[int] | None = None,
    top_logprobs_num: int = 0,
    need_logprobs: bool = True,
    backend: SamplingBackend = "auto",
    generator: torch.Generator | None = None,
) -> SampleOutput:
    """Choose one token per row.

    logits: [bs, vocab] any float dtype, on the batch's device. The caller hands them over:
    fp32 logits may be masked in place (never when logprobs are asked for).
    bitmask: xgrammar's packed int32 [bs, ceil(vocab / 32)] on the logits' device, applied to
    `mask_rows` (every row when None). Logprobs are of the raw logits, before masks, penalties
    and temperature. `generator` (on the logits' device) draws for the rows with no generator
    of their own (the server's --seed); None: torch's default.
    """
    bs, vocab = logits.shape
    if bs != batch.batch_size or vocab != batch.vocab_size:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match the sampling batch "
            f"({batch.batch_size}, {batch.vocab_size})"
        )
    work = logits.float()  # [bs, vocab]
    if bitmask is not None:
        if need_logprobs and work is logits:
            work = work.clone()
        apply_bitmask_(work, bitmask, mask_rows)
    if batch.banned_rows is not None:
        banned = (batch.banned_rows, batch.banned_ids)
        work = work.index_put(banned, torch.full((), -torch.inf, device=work.device))
    if batch.penalties is not None:
        work = batch.penalties.apply(work)
    if batch.bias_rows is not None:  # after the penalties, as in SGLang
        work = work.index_put((batch.bias_rows, batch.bias_ids), batch.bias_values,
                              accumulate=True)

    if batch.all_greedy:
        next_ids = argmax_rows(work) if work.is_cpu else work.argmax(dim=-1)  # [bs]
    elif pick_backend(backend, work) == "torch":
        next_ids = sample_by_race_torch(work, batch.temperatures, batch.top_ks, batch.top_ps,
                                        batch.min_ps, _exponential_noise(batch, work.shape,
                                                                         work.device, generator))
    else:
        next_ids = sample_from_logits(work, batch.temperatures, batch.top_ks, batch.top_ps,
                                      batch.min_ps, _uniforms(batch, work.device, generator),
                                      backend=backend)

    if not need_logprobs:  # nobody asked: skip a full pass over the logits
        return SampleOutput(next_ids=next_ids, logprobs=None, top_logprobs=None)
    top = top_logprobs(logits, top_logprobs_num) if top_logprobs_num > 0 else None
    return SampleOutput(next_ids=next_ids, logprobs=compute_logprobs(logits, next_ids),
                        top_logprobs=top)


def _uniforms(batch: SamplingBatch, device: torch.device,
              generator: torch.Generator | None) -> torch.Tensor:
    """The draw's uniforms [bs, rounds]: seeded rows from their generator, the rest at once."""
    uniforms = torch.rand((batch.batch_size, DEFAULT_NUM_ROUNDS), device=device,
                          generator=generator)
    for row in batch.seeded_rows:
        uniforms[row] = torch.rand(DEFAULT_NUM_ROUNDS, generator=batch.generators[row],
                                   device=device)
    return uniforms


_TINY = torch.finfo(torch.float32).tiny


def _exponential_noise(batch: SamplingBatch, shape: torch.Size, device: torch.device,
                       generator: torch.Generator | None) -> torch.Tensor:
    """The race's Exp(1) noise [bs, vocab]: seeded rows from their generator, the rest at once."""
    noise = torch.empty(shape, dtype=torch.float32, device=device).exponential_(
        generator=generator)
    for row in batch.seeded_rows:
        noise[row] = torch.empty(shape[1], dtype=torch.float32, device=device).exponential_(
            generator=batch.generators[row])
    return noise.clamp_(min=_TINY)  # Exp(1) can return exactly 0, and x / 0 would win
