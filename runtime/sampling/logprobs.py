"""Log-probabilities of chosen tokens and the top alternatives, for outputs and prompts."""

from __future__ import annotations

import torch


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[i, token_ids[i]] in float32.

    logits: [n, vocab] any float dtype; token_ids: [n] int. Returns [n] float32. Only the
    chosen entries are formed: logit - logsumexp(row), never the whole log_softmax.
    """
    logits = logits.float()
    chosen = logits.gather(1, token_ids.view(-1, 1).to(torch.int64)).squeeze(1)  # [n]
    return chosen - torch.logsumexp(logits, dim=-1)


def top_logprobs(logprobs_rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each row: (values [n, k] float32, ids [n, k] int64).

    Rows may be log-probabilities or raw logits: each row is normalised (log_softmax) first,
    which leaves log-probabilities unchanged. Ties are broken by torch.topk.
    """
    rows = logprobs_rows.float()
    k = min(k, rows.shape[-1])
    values, ids = rows.topk(k, dim=-1)
    return values - torch.logsumexp(rows, dim=-1, keepdim=True), ids
