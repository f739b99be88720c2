"""Repetition, frequency and presence penalties as [bs, vocab] tensors.

Built only for rows that ask for a penalty; a batch without any gets `None` and pays nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..sampling_params import SamplingParams


@dataclass
class Penalties:
    repetition: torch.Tensor | None  # [bs, 1] float32
    seen_mask: torch.Tensor | None  # [bs, vocab] bool: in prompt or output (repetition rows)
    frequency: torch.Tensor | None  # [bs, 1] float32
    presence: torch.Tensor | None  # [bs, 1] float32
    output_counts: torch.Tensor | None  # [bs, vocab] float32: occurrences in the output

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        output_ids: Sequence[Sequence[int]],
        prompt_ids: Sequence[Sequence[int]],
        vocab_size: int,
        device: torch.device | str,
    ) -> Penalties | None:
        """The penalty tensors, or None when no row has a penalty."""
        bs = len(params)
        rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
        count_rows = [
            i
            for i, p in enumerate(params)
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
        ]
        if not rep_rows and not count_rows:
            return None
        f32 = {"dtype": torch.float32, "device": device}
        penalties = cls(None, None, None, None, None)
        if rep_rows:
            penalties.repetition = _column([p.repetition_penalty for p in params], device)
            rows, ids = _flat_index(
                rep_rows, [[*prompt_ids[i], *output_ids[i]] for i in rep_rows], device
            )
            seen = torch.zeros(bs, vocab_size, dtype=torch.bool, device=device)
            seen[rows, ids] = True
            penalties.seen_mask = seen
        if count_rows:
            penalties.frequency = _column([p.frequency_penalty for p in params], device)
            penalties.presence = _column([p.presence_penalty for p in params], device)
            rows, ids = _flat_index(count_rows, [output_ids[i] for i in count_rows], device)
            counts = torch.zeros(bs, vocab_size, **f32)
            counts.index_put_((rows, ids), torch.ones(rows.shape[0], **f32), accumulate=True)
            penalties.output_counts = counts
        return penalties

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [bs, vocab] float32 -> penalised copy.

        Repetition as in HF (positive logits divided, negative multiplied), then frequency and
        presence as in OpenAI/vLLM (subtracted, counting the output only).
        """
        if self.seen_mask is not None:
            penalty = torch.where(self.seen_mask, self.repetition, 1.0)  # [bs, vocab]
            logits = torch.where(logits > 0, logits / penalty, logits * penalty)
        if self.output_counts is not None:
            counts = self.output_counts
            logits = logits - self.frequency * counts
            logits = logits - self.presence * (counts > 0).to(logits.dtype)
        return logits


def _column(values: list[float], device: torch.device | str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1)  # [bs, 1]


def _flat_index(
    rows: list[int], token_lists: Sequence[Sequence[int]], device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index pairs, [n] int64 each: token_lists[j] belongs to row rows[j]."""
    i64 = {"dtype": torch.int64, "device": device}
    lens = torch.tensor([len(t) for t in token_lists], **i64)
    token_index = torch.tensor(list(chain.from_iterable(token_lists)), **i64)
    # output_size: the length is known here, so the device need not report it back (no sync)
    row_index = torch.repeat_interleave(torch.tensor(rows, **i64), lens,
                                        output_size=token_index.shape[0])
    return row_index, token_index
