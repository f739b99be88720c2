"""Embedding requests (--is-embedding) inside the scheduler: prefilled like any prompt, in
chunks, batched with each other; the runner returns final hidden states instead of logits
(model_runner.py), pooled here chunk by chunk; the request then finishes with its vector and
no output token (finish "length", length 0, as SGLang's embedding requests do), its KV going
to the radix tree like any finished request's.

The radix cache serves every pooling: a request with a cached prefix of p tokens computes only
positions p .. (at least the last token), and pools exactly what a run from position 0 would
(to float32 rounding):
- last: the last token's hidden state is the whole answer, as for generation;
- mean, cls: a token's final hidden state depends only on its prefix, so it can be kept by KV
  slot as its K/V are. A server that pools mean or cls keeps `state.hidden_sums`
  (memory_pool.HiddenSumPool, float32 [KV slots, hidden_size], beside the KV pool): every token
  an embedding request computes gets, in its slot, the sum of the hidden states of positions
  0 .. its own, continuing from the sum in the slot of the position before the chunk (a cached
  prefix's last token, or the request's own previous chunk). So every slot the tree holds has
  its sum: mean is the sum at the last position / the length, cls the sum at position 0 (h0).
  Chunked prefill runs one sum through the slots, nothing kept in the request; a request
  that goes back to the tree's part of its prompt (a chunk whose forward failed: failures.py;
  retracted and readmitted) continues from the sum in that part's last slot. The sums are
  written only after a forward succeeds, before the chunk goes to the tree (prefill.py), so
  the tree never holds a slot without its sum. Every embedding request writes the sums,
  whatever its own pooling (in process a request may pool otherwise than the server), so no
  slot in the tree lacks one.

On a server that pools the last token no such buffer exists; a mean or cls request there (in
process only: the HTTP side asks for the server's pooling) uses no cached prefix and keeps a
running sum (and how many positions it holds) across its chunks instead, started anew when it
starts at position 0.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..memory_pool import HiddenSumPool
from ..messages import Finish
from ..model_loader.pooling import mismatch
from .req import Req

if TYPE_CHECKING:
    from ..model_runner import ModelRunner
    from .state import SchedulerState

logger = logging.getLogger(__name__)


def serves_embeddings(state: SchedulerState) -> bool:
    return getattr(state.runner, "pooling", None) is not None


def hidden_sum_pool(runner: ModelRunner, num_slots: int,
                    device: torch.device) -> HiddenSumPool | None:
    """The per-slot hidden-state sums of a server that pools mean or cls (None otherwise)."""
    pooling = getattr(runner, "pooling", None)
    if pooling is None or pooling.pooling == "last":
        return None
    hidden_size = runner.model_args.hidden_size
    pool = HiddenSumPool(num_slots, hidden_size, device)
    logger.info("embeddings: hidden-state sums per KV slot for the radix cache, %d x %d "
                "float32 (%.2f GiB)", num_slots, hidden_size, pool.nbytes / 2**30)
    return pool


def refuse_mismatched(state: SchedulerState) -> None:
    """Finish (400) the waiting requests this server cannot run: a generation on an embedding
    server (its "logits" would be hidden states), an embedding on a generation server. The
    HTTP side refuses them first (SchedulerClient.submit); this covers in-process callers."""
    embedding_server = serves_embeddings(state)
    wrong = [r for r in state.waiting if (r.embed is not None) != embedding_server]
    for req in wrong:
        state.finish(req, Finish(type="abort", status_code=400,
                                 message=mismatch(req.embed is not None, embedding_server)))


def usable_prefix(state: SchedulerState, req: Req, cap: int) -> int:
    """The cached prefix an embedding request may use (see the module's docstring)."""
    if req.embed.pooling == "last" or state.hidden_sums is not None:
        return cap
    return 0


def wanted_rows(state: SchedulerState, req: Req, start: int, n: int) -> list[int]:
    """Offsets in this chunk (positions start .. start + n - 1) whose hidden states the
    request pools (every one where the server keeps hidden-state sums)."""
    pooling = req.embed.pooling
    if pooling == "mean" or state.hidden_sums is not None:
        return list(range(n))
    if pooling == "cls":
        return [0] if start == 0 else []
    return [n - 1] if start + n == req.seq_len else []


def pool_chunk(state: SchedulerState, req: Req, start: int, hidden: torch.Tensor,
               slots: torch.Tensor) -> None:
    """Fold this chunk's wanted rows (hidden [rows, hidden_size], float32) into req.pooled
    or, where the server keeps them, the hidden-state sums of the chunk's `slots`."""
    rows = hidden.shape[0]
    if rows == 0:
        return
    sums = state.hidden_sums
    if sums is not None:  # every row: position start + i's sum goes to slots[i]
        before = state.req_to_token[req.req_pool_idx, start - 1] if start else None
        sums.write_cumsum(slots, hidden, before)
        # (the last row computed, for last-token pooling; the positions summed so far)
        req.pooled = (hidden[-1].clone(), start + rows)
    elif req.embed.pooling == "mean":
        chunk_sum = hidden.sum(dim=0)
        if start == 0 or req.pooled is None:
            req.pooled = (chunk_sum, rows)
        else:
            total, count = req.pooled
            req.pooled = (total + chunk_sum, count + rows)
    else:
        req.pooled = (hidden[-1].clone(), 1)


def finish_embedding(state: SchedulerState, req: Req) -> None:
    """The prompt is computed: its vector, and the finish (no output tokens)."""
    pooled, req.pooled = req.pooled, None
    pooling, sums = req.embed.pooling, state.hidden_sums
    # positions pooled: with the sums, the last one summed (the whole prompt's)
    expected = req.seq_len if pooling == "mean" or sums is not None else 1
    if pooled is None or pooled[1] != expected:
        got = 0 if pooled is None else pooled[1]
        state.finish(req, Finish(type="abort", status_code=500, message=(
            f"internal error: the embedding pooled {got} positions of {req.seq_len} "
            f"({pooling} pooling needs {expected})")))
        return
    if sums is None:
        vector = pooled[0] / pooled[1]
    elif pooling == "last":
        vector = pooled[0]
    else:
        slots = state.req_to_token[req.req_pool_idx]
        vector = (sums.at(slots[req.seq_len - 1]) / req.seq_len if pooling == "mean"
                  else sums.at(slots[0]))
    req.embedding = pooled_vector(vector, req.embed.dimensions, req.embed.normalize).tolist()
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
