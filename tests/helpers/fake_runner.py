"""A model runner and a tokenizer with no model, for scheduler unit tests.

`FakeRunner` has the attributes the scheduler reads (real KV and request-row pools, small) and a
`forward` whose logits make `next_token(sequence)` win for each row that wants logits. Its "KV"
is the token written at each slot: a row's sequence is read back through req_to_token, so a
slot the scheduler maps but never wrote fails the test. `CharTokenizer` decodes id i as one
character, enough for stop strings.

    runner = FakeRunner(next_token=lambda seq: seq[-1] + 1)
    sched = fake_scheduler(runner, max_running_requests=4)
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool
from radixflow.runtime.messages import GenerateReq, Message, ReqTokenOut, TokenBatchOut
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler.scheduler import Scheduler
from radixflow.runtime.server_args import ServerArgs

EOS = 1
VOCAB = 64
ALPHABET = "\x00\x01" + string.ascii_letters + string.digits  # ids 0, 1 special


def count_up(sequence: list[int]) -> int:
    """The default model: each token is the last one plus one (past the specials)."""
    return max(2, (sequence[-1] + 1) % VOCAB)



def expected(prompt: list[int], n: int) -> list[int]:
    """The fake model's greedy output: n tokens after `prompt`."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(count_up(seq))
    return seq[len(prompt):]

@dataclass
class ForwardCall:
    mode: ForwardMode
    parts: list[BatchRequest]
    num_slots: int

    @property
    def num_requests(self) -> int:
        return len({p.req_pool_idx for p in self.parts})

    @property
    def num_tokens(self) -> int:
        return sum(len(p.ids) for p in self.parts)


@dataclass
class FakeRunner:
    num_slots: int = 256
    max_running: int = 8
    context_len: int = 128
    vocab_size: int = VOCAB
    next_token: Callable[[list[int]], int] = count_up
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    calls: list[ForwardCall] = field(default_factory=list)

    def __post_init__(self):
        self.model_args = SimpleNamespace(eos_token_ids=[EOS])
        self.kv_pool = KVPool(self.num_slots, num_layers=1, num_kv_heads=1, head_dim=1,
                              dtype=self.dtype, device=self.device)
        self.req_to_token_pool = ReqToTokenPool(self.max_running, self.context_len,
                                                device=self.device)
        self.slot_token: dict[int, int] = {}  # the fake KV: which token each slot holds

    def forward(self, mode: ForwardMode, parts: list[BatchRequest],
                slots: torch.Tensor) -> torch.Tensor:
        self.calls.append(ForwardCall(mode, parts, slots.numel()))
        table = self.req_to_token_pool.req_to_token
        used, wanted = 0, []
        for part in parts:
            for k, token in enumerate(part.ids):
                slot = int(slots[used + k])
                assert slot == int(table[part.req_pool_idx, part.start_pos + k]), \
                    "the pass writes a slot its row does not map"
                self.slot_token[slot] = token
            used += len(part.ids)
            for offset in part.logit_offsets:
                end = part.start_pos + offset + 1
                wanted.append([self.slot_token[int(s)] for s in table[part.req_pool_idx, :end]])
        assert used == slots.numel()
        logits = torch.zeros(len(wanted), self.vocab_size)
        for row, sequence in enumerate(wanted):
            logits[row, self.next_token(sequence)] = 10.0
        return logits

    def reset_calls(self) -> None:
        self.calls.clear()


class CharTokenizer:
    """Token id i is ALPHABET[i]; 0 and 1 (EOS) are special."""

    eos_token_id = EOS
    bos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens: bool = True, **kwargs) -> str:
        return "".join(ALPHABET[i] for i in ids if not (skip_special_tokens and i < 2))

    def batch_decode(self, batch, **kwargs) -> list[str]:
        return [self.decode(ids, **kwargs) for ids in batch]

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) for c in text]


def fake_scheduler(runner: FakeRunner | None = None, **args) -> Scheduler:
    """A Scheduler on `runner` (a fresh FakeRunner by default), overlap off unless asked."""
    runner = runner or FakeRunner()
    args.setdefault("disable_overlap_schedule", not args.get("enable_overlap_schedule"))
    args.setdefault("max_running_requests", runner.max_running)
    server_args = ServerArgs(model="fake", device="cpu", dtype="float32", **args)
    return Scheduler(server_args, runner, CharTokenizer())


def generate(rid: str, input_ids: list[int], **sampling) -> GenerateReq:
    """A greedy request (temperature 0 unless given)."""
    sampling.setdefault("temperature", 0)
    return GenerateReq(rid=rid, input_ids=input_ids, sampling=SamplingParams(**sampling))


@dataclass
class Got:
    """What the scheduler reported of one request, summed over steps."""

    ids: list[int] = field(default_factory=list)
    outputs: list[ReqTokenOut] = field(default_factory=list)

    @property
    def finish(self):
        return self.outputs[-1].finish if self.outputs else None


def collect(out: list[Message], got: dict[str, Got]) -> dict[str, Got]:
    for msg in out:
        if isinstance(msg, TokenBatchOut):
            for o in msg.outputs:
                entry = got.setdefault(o.rid, Got())
                entry.ids += o.new_ids
                entry.outputs.append(o)
    return got


def run_to_idle(sched: Scheduler, *msgs: Message, got: dict[str, Got] | None = None,
                max_steps: int = 1000) -> dict[str, Got]:
    """Step until idle (the messages in the first step), adding what it reports to `got`;
    check the slot invariant."""
    got = {} if got is None else got
    inbox = list(msgs)
    for _ in range(max_steps):
        collect(sched.step(inbox), got)
        inbox = []
        if sched.is_idle:
            break
    assert sched.is_idle, "the scheduler did not finish its requests"
    sched.check_slots()
    return got
