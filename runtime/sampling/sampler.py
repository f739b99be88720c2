"""Batched sampling of one decode step's logits.

Order (as in Hugging Face / vLLM / SGLang): vocab mask (grammar) and min_new_tokens bans,
penalties, temperature, top-k, top-p, min-p, then the draw. Greedy rows take the argmax of the
penalised logits. A draw is the exponential race, next = argmax(probs / E) with E ~ Exp(1)
per token, which samples exactly from `probs`; a seeded row draws E only from its own
generator, so its tokens do not depend on the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixflow.kernels.cpu import argmax_rows

from .batch import SamplingBatch
from .logprobs import top_logprobs as _top_logprobs

_TINY = torch.finfo(torch.float32).tiny


@dataclass
class SampleOutput:
    next_ids: torch.Tensor  # [bs] int64
    logprobs: torch.Tensor | None  # [bs] float32: raw log_softmax at next_ids (None: not asked)
    top_logprobs: tuple[torch.Tensor, torch.Tensor] | None  # ([bs, k] float32, [bs, k] int64)


def sample(
    logits: torch.Tensor,
    batch: SamplingBatch,
    *,
    top_logprobs_num: int = 0,
    vocab_mask: torch.Tensor | None = None,
    need_logprobs: bool = True,
) -> SampleOutput:
    """Choose one token per row.

    logits: [bs, vocab] any float dtype (computed in float32, never modified).
    vocab_mask: [bs, vocab] bool (True = allowed) or a packed int32 bitmask
    [bs, ceil(vocab / 32)] (bit j of word w allows token 32 * w + j, xgrammar's layout).
    Logprobs are of the raw logits, before masks, penalties and temperature.
    """
    bs, vocab = logits.shape
    if bs != batch.batch_size or vocab != batch.vocab_size:
        raise ValueError(
            f"logits {tuple(logits.shape)} do not match the sampling batch "
            f"({batch.batch_size}, {batch.vocab_size})"
        )
    raw = logits.float()  # [bs, vocab]
    work = raw
    if vocab_mask is not None:
        work = apply_vocab_mask(work, vocab_mask)
    if batch.banned_rows is not None:
        banned = (batch.banned_rows, batch.banned_ids)
        work = work.index_put(banned, torch.full((), -torch.inf, device=work.device))
    if batch.penalties is not None:
        work = batch.penalties.apply(work)

    next_ids = argmax_rows(work) if work.is_cpu else work.argmax(dim=-1)  # [bs]
    if not batch.all_greedy:
        sampled = _sample_from_logits(work, batch)
        next_ids = torch.where(batch.is_greedy, next_ids, sampled)

    if not need_logprobs:  # nobody asked: skip a full pass over the logits
        return SampleOutput(next_ids=next_ids, logprobs=None, top_logprobs=None)
    log_norm = torch.logsumexp(raw, dim=-1)  # [bs]
    logprobs = raw.gather(1, next_ids.view(-1, 1)).squeeze(1) - log_norm
    top = _top_logprobs(raw, top_logprobs_num) if top_logprobs_num > 0 else None
    return SampleOutput(next_ids=next_ids, logprobs=logprobs, top_logprobs=top)


def apply_vocab_mask(logits: torch.Tensor, vocab_mask: torch.Tensor) -> torch.Tensor:
    """-inf wherever the mask disallows a token; returns a new tensor. The one place a
    grammar's mask meets the logits (bool [bs, vocab] or packed int32 [bs, words])."""
    if vocab_mask.dtype != torch.bool:
        vocab_mask = unpack_bitmask(vocab_mask, logits.shape[-1])
    return logits.masked_fill(~vocab_mask, -torch.inf)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Packed int32 [bs, words] -> bool [bs, vocab_size]; tokens past the bitmask are disallowed."""
    bs, words = bitmask.shape
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1  # [bs, words, 32]
    allowed = bits.view(bs, words * 32).bool()
    if words * 32 >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(bs, vocab_size - words * 32, dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=-1)


def _sample_from_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row from softmax(logits / T) after top-k / top-p / min-p. Returns [bs]."""
    probs = torch.softmax(logits / batch.temperatures, dim=-1)  # [bs, vocab]
    noise = _exponential_noise(batch, probs.shape, probs.device)  # [bs, vocab]
    if not (batch.need_top_k or batch.need_top_p):
        if batch.need_min_p:
            probs = _min_p_filter(probs, probs.amax(dim=-1, keepdim=True), batch)
        return (probs / noise).argmax(dim=-1)

    sorted_probs, order = probs.sort(dim=-1, descending=True)  # [bs, vocab] each
    if batch.need_top_k:
        ranks = torch.arange(probs.shape[-1], device=probs.device)
        sorted_probs = sorted_probs.masked_fill(ranks >= batch.top_ks.view(-1, 1), 0.0)
    if batch.need_top_p:
        cumulative = sorted_probs.cumsum(dim=-1)
        kept_mass = cumulative[:, -1:]  # top-p is over what top-k kept, renormalised (HF)
        mass_before = cumulative - sorted_probs
        active = (batch.top_ps < 1.0).view(-1, 1)
        drop = (mass_before >= batch.top_ps.view(-1, 1) * kept_mass) & active
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    if batch.need_min_p:
        sorted_probs = _min_p_filter(sorted_probs, sorted_probs[:, :1], batch)
    choice = (sorted_probs / noise.gather(1, order)).argmax(dim=-1, keepdim=True)  # [bs, 1]
    return order.gather(1, choice).squeeze(1)


def _min_p_filter(probs: torch.Tensor, max_probs: torch.Tensor, batch: SamplingBatch):
    """Drop tokens less likely than min_p times the row's most likely token."""
    return probs.masked_fill(probs < max_probs * batch.min_ps.view(-1, 1), 0.0)


def _exponential_noise(
    batch: SamplingBatch, shape: torch.Size, device: torch.device
) -> torch.Tensor:
    """Exp(1) noise [bs, vocab]: seeded rows from their generator, the rest in one call."""
    if not batch.seeded_rows:
        noise = torch.empty(shape, dtype=torch.float32, device=device).exponential_()
    else:
        noise = torch.ones(shape, dtype=torch.float32, device=device)
        if batch.unseeded_rows is not None and batch.unseeded_rows.numel() > 0:
            rows = batch.unseeded_rows
            noise[rows] = torch.empty(
                (rows.shape[0], shape[1]), dtype=torch.float32, device=device
            ).exponential_()
        for row in batch.seeded_rows:
            # A fresh [vocab] draw, so the values depend on nothing but this generator.
            noise[row] = torch.empty(shape[1], dtype=torch.float32, device=device).exponential_(
                generator=batch.generators[row]
            )
    # NOTE: Exp(1) can return exactly 0; 0/0 is NaN, which argmax would pick.
    return noise.clamp_(min=_TINY)
