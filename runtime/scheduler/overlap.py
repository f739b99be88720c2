"""Overlapped decoding: the model computes step N+1 while the scheduler finishes step N.

Without overlap a decode step is: forward, sample, then the CPU work on the sampled tokens
(stop strings, grammars, jump-forward, outputs for the detokenizer, new messages, the next
batch), during which the model idles. With overlap (SGLang's overlap scheduler, here on a
forward thread), the scheduler samples step N, appends each token tentatively, launches step
N+1's forward at once on that thread, and only then does step N's CPU work, while the forward
runs. Step N+1's grammar masks are filled after step N's tokens are accepted, still during
its forward.

What step N's work decides after N+1 was launched is handled when N+1's logits come back:
a row whose request finished, was aborted or retracted, or jumped forward (its sequence
changed) is dropped unsampled; its K/V writes were to slots it owned at launch, and since the
forward thread runs one pass at a time, no later pass can read a slot before an earlier pass
wrote it. Anything that admits requests (prefill) first drains the pass in flight.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .grammar import MaskJob
from .req import Req, ReqStatus


@dataclass
class InFlight:
    """A decode pass on the forward thread: one logits row per request in `reqs`."""

    reqs: list[Req]
    seq_lens: list[int]  # each request's length at launch: a row is valid while it holds
    logits: Future  # -> torch.Tensor [len(reqs), vocab]
    mask: MaskJob | None = None  # filled for `masked` after the tokens before were accepted
    masked: list[Req] | None = None

    def still_valid(self, i: int) -> bool:
        req = self.reqs[i]
        return (req.status == ReqStatus.RUNNING and req.finish is None
                and req.seq_len == self.seq_lens[i])


class ForwardThread:
    """One thread that runs forward passes in the order they are submitted."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixflow-forward")

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(torch.inference_mode()(fn), *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
