"""Per-step sampling tensors, built once from the batch's requests."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..sampling_params import LOGIT_BIAS_LIMIT
from .penalties import Penalties

if TYPE_CHECKING:
    from ..sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """What `sample` needs for one decode step of `bs` requests, on the logits' device.

    Greedy rows carry temperature 0, which the draw treats as greedy (the argmax).
    """

    vocab_size: int
    temperatures: torch.Tensor  # [bs] float32; 0 on greedy rows
    top_ks: torch.Tensor  # [bs] int32; -1 or vocab_size = disabled
    top_ps: torch.Tensor  # [bs] float32; 1.0 = disabled
    min_ps: torch.Tensor  # [bs] float32; 0.0 = disabled
    generators: list[torch.Generator | None]
    seeded_rows: list[int]  # non-greedy rows that draw from their own generator
    all_greedy: bool
    # min_new_tokens not reached yet: logits[banned_rows[j], banned_ids[j]] = -inf.
    banned_rows: torch.Tensor | None  # [num_banned] int64
    banned_ids: torch.Tensor | None  # [num_banned] int64
    penalties: Penalties | None  # None: no row has a penalty
    # logit_bias: logits[bias_rows[j], bias_ids[j]] += bias_values[j] (-100 is -inf, a ban).
    bias_rows: torch.Tensor | None = None  # [num_biased] int64; None: no row has a bias
    bias_ids: torch.Tensor | None = None  # [num_biased] int64
    bias_values: torch.Tensor | None = None  # [num_biased] float32

    @property
    def batch_size(self) -> int:
        return self.temperatures.shape[0]

    @property
    def needs_penalties(self) -> bool:
        return self.penalties is not None

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        output_ids: list[list[int]],
        prompt_ids: list[list[int]],
        generators: list[torch.Generator | None],
        eos_ids: list[int],
        vocab_size: int,
        device: torch.device | str,
    ) -> SamplingBatch:
        """Build the tensors for one step, on `device` (the generators must be there too).

        `output_ids` / `prompt_ids` / `generators` are per request; `eos_ids` are the model's
        end-of-sequence ids (shared by all rows), banned with each row's `stop_token_ids` while
        the row has fewer than `min_new_tokens` outputs (EOS is not banned for `ignore_eos`
        rows, as in vLLM, since EOS does not end them).

        Raises
        ------
        ValueError: per-request lists of different lengths, or a generator on another device.
        """
        bs = len(params)
        if not (len(output_ids) == len(prompt_ids) == len(generators) == bs):
            raise ValueError(
                f"per-request lists differ in length: params {bs}, output_ids {len(output_ids)}, "
                f"prompt_ids {len(prompt_ids)}, generators {len(generators)}"
            )
        device = torch.device(device)
        for gen in generators:
            if gen is not None and gen.device != device:
                raise ValueError(f"a request's generator is on {gen.device}, the batch on {device}")
        is_greedy = [p.is_greedy for p in params]
        temperatures = [0.0 if g else p.temperature for p, g in zip(params, is_greedy, strict=True)]
        banned_rows, banned_ids = _min_new_tokens_bans(params, output_ids, eos_ids, vocab_size)
        f32 = {"dtype": torch.float32, "device": device}
        bias_rows, bias_ids, bias_values = _logit_biases(params, vocab_size, device)
        return cls(
            vocab_size=vocab_size,
            temperatures=torch.tensor(temperatures, **f32),
            top_ks=torch.tensor([min(p.top_k, vocab_size) for p in params], dtype=torch.int32,
                                device=device),
            top_ps=torch.tensor([p.top_p for p in params], **f32),
            min_ps=torch.tensor([p.min_p for p in params], **f32),
            generators=list(generators),
            seeded_rows=[i for i in range(bs) if not is_greedy[i] and generators[i] is not None],
            all_greedy=all(is_greedy),
            banned_rows=_as_index(banned_rows, device),
            banned_ids=_as_index(banned_ids, device),
            penalties=Penalties.build(params, output_ids, prompt_ids, vocab_size, device),
            bias_rows=bias_rows,
            bias_ids=bias_ids,
            bias_values=bias_values,
        )


def _as_index(values: list[int], device: torch.device) -> torch.Tensor | None:
    return torch.tensor(values, dtype=torch.int64, device=device) if values else None


def _min_new_tokens_bans(
    params: list[SamplingParams], output_ids: list[list[int]], eos_ids: list[int], vocab_size: int
) -> tuple[list[int], list[int]]:
    rows: list[int] = []
    ids: list[int] = []
    for i, (p, out) in enumerate(zip(params, output_ids, strict=True)):
        if len(out) >= p.min_new_tokens:
            continue
        banned = set(p.stop_token_ids)
        if not p.ignore_eos:
            banned.update(eos_ids)
        # Ids past the vocabulary cannot be sampled anyway.
        banned = {t for t in banned if t < vocab_size}
        rows.extend([i] * len(banned))
        ids.extend(sorted(banned))
    return rows, ids


def _logit_biases(
    params: list[SamplingParams], vocab_size: int, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(rows, ids, values) of every row's logit_bias, or Nones when no row has one."""
    rows: list[int] = []
    ids: list[int] = []
    values: list[float] = []
    for i, p in enumerate(params):
        if not p.logit_bias:
            continue
        # Ids past the vocabulary were refused at parse time; never index out of range here.
        items = [(t, b) for t, b in p.logit_bias.items() if t < vocab_size]
        rows.extend([i] * len(items))
        ids.extend(t for t, _ in items)
        values.extend(-math.inf if b <= -LOGIT_BIAS_LIMIT else b for _, b in items)
    if not rows:
        return None, None, None
    return (_as_index(rows, device), _as_index(ids, device),
            torch.tensor(values, dtype=torch.float32, device=device))
