"""Req: one request's whole story inside the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..messages import EmbedSpec, Finish, GenerateReq
from ..sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixflow.radix_cache import TreeNode

    from ..constrained import Constraint, GrammarState, PendingGrammar
    from ..detokenize import IncrementalDetokenizer
    from .reasoning import Thinking
    from .sessions import SessionNode
    from .speculate import SpecState


class ReqStatus(enum.Enum):
    WAITING = "waiting"  # queued; holds no row and no slots
    PREFILLING = "prefilling"  # holds a row; its prompt is being computed in chunks
    RUNNING = "running"  # decoding
    FINISHED = "finished"


@dataclass(eq=False)  # identity hash: a Req may sit in sets
class Req:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    arrival: int = 0  # admission order, for FCFS and fairness
    cached_len: int = 0  # prompt tokens whose KV came from the tree at first admission
    computed_len: int = 0  # tokens of fill_ids whose KV is in the pool (row prefix)
    tree_len: int = 0  # leading tokens whose slots the tree owns (locked through last_node)
    # [first, below): positions whose KV was freed behind every layer's window (window_kv.py)
    window_freed: tuple[int, int] | None = None
    req_pool_idx: int | None = None  # its row of req_to_token (ReqToTokenPool)
    last_node: TreeNode | None = None  # locked tree node; unlocked exactly once
    finish: Finish | None = None
    num_retractions: int = 0
    generator: torch.Generator | None = None
    stop_checker: IncrementalDetokenizer | None = None  # when the request has stop strings
    constraint: Constraint | None = None  # sampling's, as the front door prepared it
    grammar: GrammarState | None = None  # when the request has a constraint (and answers)
    pending_grammar: PendingGrammar | None = None  # while the constraint compiles (not admitted)
    can_jump: bool = False  # may get tokens without sampling (jump-forward, forced EOS)
    # Pending output (delta since the last ReqTokenOut)
    sent_len: int = 0  # output tokens already reported
    pending_logprobs: list[float] = field(default_factory=list)
    pending_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    reported_input_logprobs: bool = False
    session_node: SessionNode | None = None  # its node in a session while it runs
    thinking: Thinking | None = None  # of a request that separates its reasoning
    announced: bool = False  # its first output, which says how to decode it, went out
    priority: int = 0  # lower first (--enable-priority-scheduling; the message's None is 0)
    cache_salt: str | None = None  # its namespace in the radix tree (None: unsalted)
    # An embedding request (scheduler/embedding.py): how it pools, what it pooled so far
    # (a row and how many positions it covers; where the server keeps per-slot sums, those
    # hold the sums), the vector at its finish.
    embed: EmbedSpec | None = None
    pooled: tuple[torch.Tensor, int] | None = None
    embedding: list[float] | None = None
    # Speculative decoding (speculate.py): the request's own switch and prediction, and once it
    # drafts, its drafter and counts.
    speculative: bool | None = None
    prediction_ids: list[int] | None = None
    spec: SpecState | None = None

    @classmethod
    def from_message(cls, msg: GenerateReq, arrival: int, device: torch.device) -> Req:
        """The request as the scheduler holds it; a seed's generator lives on `device`, the
        model's, where the sampler draws from it."""
        req = cls(rid=msg.rid, input_ids=list(msg.input_ids), sampling=msg.sampling,
                  return_logprob=msg.return_logprob, logprob_start_len=msg.logprob_start_len,
                  top_logprobs_num=msg.top_logprobs_num, arrival=arrival,
                  constraint=msg.constraint, priority=msg.priority or 0,
                  cache_salt=msg.cache_salt, embed=msg.embed, speculative=msg.speculative,
                  prediction_ids=msg.prediction_ids)
        if msg.sampling.seed is not None:
            req.generator = torch.Generator(device=device).manual_seed(msg.sampling.seed)
        return req

    @property
    def fill_ids(self) -> list[int]:
        """Every token that must have KV before the next token can be sampled."""
        return self.input_ids + self.output_ids

    def token_at(self, pos: int) -> int:
        """fill_ids[pos], without building fill_ids."""
        n = len(self.input_ids)
        return self.input_ids[pos] if pos < n else self.output_ids[pos - n]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def owned_slots(self) -> int:
        """KV slots the request holds beyond its tree part (less those freed behind windows)."""
        gap = 0 if self.window_freed is None else self.window_freed[1] - self.window_freed[0]
        return self.computed_len - self.tree_len - gap

    @property
    def wants_input_logprobs(self) -> bool:
        return self.return_logprob and self.logprob_start_len >= 0

    @property
    def num_tokens_left(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)
