"""Per-step sampling tensors, built once from the batch's requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .penalties import Penalties

if TYPE_CHECKING:
    from ..sampling_params import SamplingParams


@dataclass
class SamplingBatch:
    """What `sample` needs for one decode step of `bs` requests.

    Greedy rows carry neutral values (temperature 1, no filters) so the batched sampling path
    can run over every row; their token is the argmax, chosen with `is_greedy`.
    """

    vocab_size: int
    temperatures: torch.Tensor  # [bs, 1] float32
    top_ps: torch.Tensor  # [bs] float32; 1.0 = disabled
    top_ks: torch.Tensor  # [bs] int64; vocab_size = disabled
    min_ps: torch.Tensor  # [bs] float32; 0.0 = disabled
    is_greedy: torch.Tensor  # [bs] bool
    generators: list[torch.Generator | None]
    seeded_rows: list[int]  # non-greedy rows that draw noise from their own generator
    unseeded_rows: torch.Tensor | None  # [num_unseeded] int64, None when no row is seeded
    all_greedy: bool
    need_top_k: bool
    need_top_p: bool
    need_min_p: bool
    # min_new_tokens not reached yet: logits[banned_rows[j], banned_ids[j]] = -inf.
    banned_rows: torch.Tensor | None  # [num_banned] int64
    banned_ids: torch.Tensor | None  # [num_banned] int64
    penalties: Penalties | None  # None: no row has a penalty

    @property
    def batch_size(self) -> int:
        return self.is_greedy.shape[0]

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
        """Build the tensors for one step.

        `output_ids` / `prompt_ids` / `generators` are per request; `eos_ids` are the model's
        end-of-sequence ids (shared by all rows), banned with each row's `stop_token_ids` while
        the row has fewer than `min_new_tokens` outputs (EOS is not banned for `ignore_eos`
        rows, as in vLLM, since EOS does not end them).
        """
        bs = len(params)
        if not (len(output_ids) == len(prompt_ids) == len(generators) == bs):
            raise ValueError(
                f"per-request lists differ in length: params {bs}, output_ids {len(output_ids)}, "
                f"prompt_ids {len(prompt_ids)}, generators {len(generators)}"
            )
        is_greedy = [p.is_greedy for p in params]
        temperatures = [1.0 if g else p.temperature for p, g in zip(params, is_greedy)]
        top_ps = [1.0 if g else p.top_p for p, g in zip(params, is_greedy)]
        top_ks = [
            vocab_size if g or p.top_k < 0 else min(p.top_k, vocab_size)
            for p, g in zip(params, is_greedy)
        ]
        min_ps = [0.0 if g else p.min_p for p, g in zip(params, is_greedy)]
        seeded_rows = [i for i in range(bs) if not is_greedy[i] and generators[i] is not None]
        unseeded_rows = None
        if seeded_rows:
            seeded = set(seeded_rows)
            unseeded = [i for i in range(bs) if i not in seeded]
            unseeded_rows = torch.tensor(unseeded, dtype=torch.int64, device=device)

        banned_rows, banned_ids = _min_new_tokens_bans(params, output_ids, eos_ids, vocab_size)
        f32 = {"dtype": torch.float32, "device": device}
        return cls(
            vocab_size=vocab_size,
            temperatures=torch.tensor(temperatures, **f32).view(bs, 1),
            top_ps=torch.tensor(top_ps, **f32),
            top_ks=torch.tensor(top_ks, dtype=torch.int64, device=device),
            min_ps=torch.tensor(min_ps, **f32),
            is_greedy=torch.tensor(is_greedy, dtype=torch.bool, device=device),
            generators=list(generators),
            seeded_rows=seeded_rows,
            unseeded_rows=unseeded_rows,
            all_greedy=all(is_greedy),
            need_top_k=any(k < vocab_size for k in top_ks),
            need_top_p=any(p < 1.0 for p in top_ps),
            need_min_p=any(p > 0.0 for p in min_ps),
            banned_rows=_as_index(banned_rows, device),
            banned_ids=_as_index(banned_ids, device),
            penalties=Penalties.build(params, output_ids, prompt_ids, vocab_size, device),
        )


def _as_index(values: list[int], device: torch.device | str) -> torch.Tensor | None:
    return torch.tensor(values, dtype=torch.int64, device=device) if values else None


def _min_new_tokens_bans(
    params: list[SamplingParams], output_ids: list[list[int]], eos_ids: list[int], vocab_size: int
) -> tuple[list[int], list[int]]:
    rows: list[int] = []
    ids: list[int] = []
    for i, (p, out) in enumerate(zip(params, output_ids)):
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
