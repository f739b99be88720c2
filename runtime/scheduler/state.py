"""What the scheduler's parts share: the queues, who owns which KV slot, the model runner and
the counters; and the one move every part makes, a request finishing.

A request sits in exactly one queue: `waiting` (no row, no slots), `prefilling` (a row; its
prompt computed in chunks), `running` (decoding); `by_rid` finds it while it is in any.
`touched` collects the requests to report at the end of the step (output.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from radixflow.radix_cache import RadixTree

from ..forward_batch import BatchRequest, ForwardMode
from ..messages import Finish
from .device import concrete_device
from .embedding import hidden_sum_pool
from .failures import forward_in_parts
from .kv_cache import KVCache
from .req import Req, ReqStatus
from .sessions import Sessions
from .window_kv import window_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..model_runner import ModelRunner
    from ..server_args import ServerArgs
    from .decode import InFlight


class SchedulerState:
    def __init__(self, args: ServerArgs, runner: ModelRunner,
                 tokenizer: PreTrainedTokenizerBase, eos_ids: set[int]):
        self.args, self.runner, self.tokenizer = args, runner, tokenizer
        self.device = concrete_device(runner.device)
        self.eos_ids = eos_ids
        self.context_len: int = runner.context_len
        self.tree = RadixTree(disabled=args.disable_radix_cache)
        self.kv_pool, self.req_to_token_pool = runner.kv_pool, runner.req_to_token_pool
        self.req_to_token = self.req_to_token_pool.req_to_token
        self.kv = KVCache(self.tree, self.kv_pool, self.req_to_token_pool)
        # every layer windowed: the window, behind which requests free their KV (window_kv.py)
        self.kv_window = window_of(runner.model_args)
        # a mean- or cls-pooling embedding server's per-slot hidden-state sums (embedding.py)
        self.hidden_sums = hidden_sum_pool(runner, self.kv_pool.num_slots, self.kv_pool.device)
        self.sessions = Sessions(getattr(tokenizer, "bos_token_id", None),
                                 max_open=args.max_open_sessions,
                                 max_requests=args.max_session_requests,
                                 max_timeout=args.max_session_timeout)
        self.waiting: list[Req] = []
        self.prefilling: list[Req] = []
        self.running: list[Req] = []
        self.by_rid: dict[str, Req] = {}
        self.touched: dict[str, Req] = {}
        self.in_flight: InFlight | None = None  # the decode pass on the forward thread (overlap)
        self.stats = {"cache_hit_tokens": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.num_arrivals = 0
        self.num_retractions = 0
        self.num_forward_passes = 0
        self.num_request_forwards = 0  # requests taking part, summed over forward passes

    @property
    def is_idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.running or self.in_flight)

    def finish(self, req: Req, finish: Finish) -> None:
        """End the request wherever it is: its KV goes to the tree, it leaves its queue."""
        req.finish = finish
        self.touched[req.rid] = req
        if req.session_node is not None:
            self.sessions.finished(req, refused=finish.status_code is not None)
        if req.status in (ReqStatus.PREFILLING, ReqStatus.RUNNING):
            self.kv.release(req)
            (self.prefilling if req.status == ReqStatus.PREFILLING else self.running).remove(req)
        elif req.status == ReqStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
        req.status = ReqStatus.FINISHED
        self.by_rid.pop(req.rid, None)

    def forward(self, mode: ForwardMode, parts: list[BatchRequest],
                slots: torch.Tensor) -> torch.Tensor:
        """The runner's logits for `parts`, counted (run again in halves if it fails)."""
        self.num_forward_passes += 1
        self.num_request_forwards += len({part.req_pool_idx for part in parts})
        return forward_in_parts(self.runner.forward, mode, parts, slots)

    def check_slots(self) -> None:
        """Invariant: free + tree + held by live requests == total (call when consistent)."""
        self.kv.check(self.prefilling + self.running)

