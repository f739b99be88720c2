"""Embedding requests (--is-embedding) inside the scheduler: prefilled like any prompt, in
chunks, batched with each other; the runner returns final hidden states instead of logits
(model_runner.py), pooled here chunk by chunk; the request then finishes with its vector and
no output token (finish "length", length 0, as SGLang's embedding requests do), its KV going
to the radix tree like any finished request's.

What of the radix cache each pooling can use (prefill.prefix_cap asks `usable_prefix`):
- last: a cached prefix is used as for generation (at least the last token is computed, and
  its hidden state is the whole answer);
- mean, cls: none. A cached prefix has K/V but no hidden states, and mean pooling needs every
  position's (cls the first one's), so such a request recomputes its prompt from position 0.
  Its KV still goes to the tree at the finish, so generation-style reuse stays possible for
  last-token requests of the same tokens.

Mean pooling keeps a running sum of the hidden states (and how many positions it holds)
across the chunks of a chunked prefill, so no chunk's rows are kept; a request that restarts
at position 0 (retracted, readmitted) starts a new sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..messages import Finish
from ..model_loader.pooling import mismatch
from .req import Req

if TYPE_CHECKING:
    from .state import SchedulerState


def serves_embeddings(state: SchedulerState) -> bool:
    return getattr(state.runner, "pooling", None) is not None


def refuse_mismatched(state: SchedulerState) -> None:
    """Finish (400) the waiting requests this server cannot run: a generation on an embedding
    server (its "logits" would be hidden states), an embedding on a generation server. The
    HTTP side refuses them first (SchedulerClient.submit); this covers in-process callers."""
    embedding_server = serves_embeddings(state)
    wrong = [r for r in state.waiting if (r.embed is not None) != embedding_server]
    for req in wrong:
        state.finish(req, Finish(type="abort", status_code=400,
                                 message=mismatch(req.embed is not None, embedding_server)))


def usable_prefix(req: Req, cap: int) -> int:
    """The cached prefix an embedding request may use (see the module's docstring)."""
    return cap if req.embed.pooling == "last" else 0


def wanted_rows(req: Req, start: int, n: int) -> list[int]:
    """Offsets in this chunk (positions start .. start + n - 1) whose hidden states the
    request pools."""
    pooling = req.embed.pooling
    if pooling == "mean":
        return list(range(n))
    if pooling == "cls":
        return [0] if start == 0 else []
    return [n - 1] if start + n == req.seq_len else []


def pool_chunk(req: Req, start: int, hidden: torch.Tensor) -> None:
    """Fold this chunk's wanted rows (hidden [rows, hidden_size], float32) into req.pooled."""
    if hidden.shape[0] == 0:
        return
    if req.embed.pooling == "mean":
        chunk_sum = hidden.sum(dim=0)
        if start == 0 or req.pooled is None:
            req.pooled = (chunk_sum, hidden.shape[0])
        else:
            total, count = req.pooled
            req.pooled = (total + chunk_sum, count + hidden.shape[0])
    else:
        req.pooled = (hidden[-1].clone(), 1)


def finish_embedding(state: SchedulerState, req: Req) -> None:
    """The prompt is computed: its vector, and the finish (no output tokens)."""
    pooled, req.pooled = req.pooled, None
    expected = req.seq_len if req.embed.pooling == "mean" else 1
    if pooled is None or pooled[1] != expected:
        got = 0 if pooled is None else pooled[1]
        state.finish(req, Finish(type="abort", status_code=500, message=(
            f"internal error: the embedding pooled {got} positions of {req.seq_len} "
            f"({req.embed.pooling} pooling needs {expected})")))
        return
    req.embedding = pooled_vector(pooled[0] / pooled[1], req.embed.dimensions,
                                  req.embed.normalize).tolist()
    state.finish(req, Finish(type="length", length=0))


def pooled_vector(vector: torch.Tensor, dimensions: int | None,
                  normalize: bool) -> torch.Tensor:
    """Truncated to `dimensions` (Matryoshka), then L2-normalised when asked (as
    sentence-transformers' Normalize: eps 1e-12)."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = F.normalize(vector, p=2, dim=0)
    return vector.float().cpu()
