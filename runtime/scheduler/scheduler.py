"""Scheduler: continuous batching over the radix cache. `step(inbox) -> outbox`, no sockets.

One step = handle messages, run one prefill ("extend") batch if there is prefill work (at most
--prefill-budget-while-decoding tokens while others decode, so their streams keep their pace),
then one decode batch if requests are running, and report every request that got new tokens.

The work is split by job, each part sharing the queues and counters (state.py):
intake.py (a message becomes a waiting request), prefill.py (admission, extend, prompt
logprobs), decode.py (planning, KV for decode, retraction, the overlapped path), commit.py
(sampling, appending, stops, finishing), forced_tokens.py (jump-forward, budget-safe closing,
rollback: tokens nobody sampled), speculate.py (drafts verified in the decode pass) and
failures.py (one request's failure fails it alone).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ..messages import (
    AbortReq,
    CacheSnapshot,
    CacheSnapshotReq,
    CloseSessionReq,
    FlushCacheDone,
    FlushCacheReq,
    GenerateReq,
    Message,
    OpenSessionDone,
    OpenSessionReq,
    SchedulerStats,
    SessionsClosed,
    TokenBatchOut,
)
from ..model_loader.generation_defaults import sampling_defaults
from ..reasoning import ReasoningParser
from ..server_args import ServerArgs, chat_template_text
from .cache_view import cache_view
from .commit import Commit
from .decode import Decode, overlap_wanted
from .device import use_device
from .failures import Failures
from .forced_tokens import ForcedTokens
from .grammar import SchedulerGrammar
from .intake import Intake
from .output import make_output
from .prefill import Prefill
from .reasoning import SchedulerReasoning
from .req import Req
from .sessions import Sessions
from .speculate import Speculate
from .state import SchedulerState

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from ..model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, args: ServerArgs, runner: ModelRunner,
                 tokenizer: PreTrainedTokenizerBase, *, eos_ids: set[int] | None = None,
                 model_folder: Path | None = None):
        """`eos_ids`: the ids that end an output (by default the model's and the tokenizer's
        EOS); `model_folder` is only reported (model_info)."""
        self.args, self.runner, self.tokenizer = args, runner, tokenizer
        self.model_folder = model_folder
        self.eos_ids = eos_ids if eos_ids is not None else model_eos_ids(runner, tokenizer)
        self.state = state = SchedulerState(args, runner, tokenizer, self.eos_ids)
        self.context_len: int = state.context_len
        self.sessions: Sessions = state.sessions
        self.grammars = SchedulerGrammar(
            tokenizer, runner.vocab_size, stop_token_ids=sorted(self.eos_ids),
            compile_timeout=args.grammar_compile_timeout,
            compile_threads=args.grammar_compile_threads,
            jump_forward=not args.disable_jump_forward,
            budget_safe=not args.disable_budget_safe_close, context_len=self.context_len)
        self.reasoning = SchedulerReasoning(
            ReasoningParser.load(args.reasoning_parser, tokenizer), self.eos_ids,
            runner.vocab_size)
        self.failures = Failures(state, self.grammars)
        forced = ForcedTokens(state, self.grammars)
        self.commit = Commit(state, self.grammars, self.reasoning, forced, self.failures)
        self.speculate = Speculate(state, self.grammars, self.commit, args.speculation_config())
        self.decode = Decode(state, self.grammars, self.commit,
                             overlap=overlap_wanted(args, state.device),
                             speculate=self.speculate)
        self.prefill = Prefill(state, self.grammars, self.commit)
        self.intake = Intake(state, self.grammars, self.reasoning, forced, self.failures)

    @classmethod
    def from_args(cls, args: ServerArgs, *, model_folder: Path | None = None,
                  hf_config: dict | None = None,
                  tokenizer: PreTrainedTokenizerBase | None = None) -> Scheduler:
        """The scheduler of `args.model`: its tokenizer (and --chat-template), its weights."""
        from ..model_loader import load_config, load_tokenizer, resolve_model
        from ..model_runner import ModelRunner

        model_folder = model_folder or resolve_model(args.model)
        hf_config = hf_config or load_config(model_folder)
        tokenizer = tokenizer or load_tokenizer(args.tokenizer or model_folder)
        if args.chat_template is not None:
            tokenizer.chat_template = chat_template_text(args.chat_template)
        runner = ModelRunner(args, model_folder, hf_config)
        eos_ids = model_eos_ids(runner, tokenizer) | generation_config_eos_ids(model_folder)
        return cls(args, runner, tokenizer, eos_ids=eos_ids, model_folder=model_folder)

    # ---- the queues (state.py) ----

    @property
    def waiting(self) -> list[Req]:
        return self.state.waiting

    @property
    def prefilling(self) -> list[Req]:
        return self.state.prefilling

    @property
    def running(self) -> list[Req]:
        return self.state.running

    @property
    def by_rid(self) -> dict[str, Req]:
        return self.state.by_rid

    @property
    def is_idle(self) -> bool:
        return self.state.is_idle

    # ---- counters, for benchmarks and tests ----

    @property
    def num_retractions(self) -> int:
        return self.state.num_retractions

    @property
    def num_forward_passes(self) -> int:
        return self.state.num_forward_passes

    @property
    def num_request_forwards(self) -> int:
        """Requests taking part, summed over forward passes."""
        return self.state.num_request_forwards

    @property
    def overlap(self) -> bool:
        return self.decode.overlap

    @property
    def prefill_budget(self) -> int:
        return self.prefill.budget_while_decoding

    # ---- one step ----

    def step(self, inbox: list[Message]) -> list[Message]:
        out: list[Message] = []
        if self.sessions:
            self.sessions.reap()
        for msg in inbox:
            self._handle(msg, out)
        self.failures.guard(self._run_batches)
        expired = self.sessions.take_expired()
        if expired:
            out.append(SessionsClosed(session_ids=expired))
        self._report(out)
        return out

    def _run_batches(self) -> None:
        self.intake.resolve_grammars()
        if self.prefilling or any(r.pending_grammar is None for r in self.waiting):
            self.decode.drain()  # (admission may reuse the rows and slots of the pass in flight)
            self.prefill.run()
        self.decode.run()

    def _report(self, out: list[Message]) -> None:
        touched = self.state.touched
        if touched:
            outputs = [make_output(r) for r in touched.values()]
            touched.clear()
            outputs = [o for o in outputs if o is not None]
            if outputs:
                out.append(TokenBatchOut(outputs=outputs))

    # ---- messages ----

    def _handle(self, msg: Message, out: list[Message]) -> None:
        if isinstance(msg, GenerateReq):
            self.failures.add_request(msg, self.intake.add)  # its failure fails it alone
        elif isinstance(msg, AbortReq):
            self.intake.abort(msg.rid, "aborted by the client")
        elif isinstance(msg, FlushCacheReq):
            out.append(FlushCacheDone(success=self._flush_cache()))
        elif isinstance(msg, OpenSessionReq):
            error, status = self.sessions.open(msg.session_id, msg.capacity_of_str_len,
                                               msg.timeout) or (None, None)
            out.append(OpenSessionDone(session_id=msg.session_id, success=error is None,
                                       message=error, status_code=status))
        elif isinstance(msg, CacheSnapshotReq):
            out.append(CacheSnapshot(query_id=msg.query_id,
                                     view=cache_view(self.state, msg.max_nodes, self.grammars)))
        elif isinstance(msg, CloseSessionReq):
            if not self.sessions.close(msg.session_id):
                logger.info("close_session: no open session %r", msg.session_id)
        else:
            logger.warning("scheduler ignores unexpected message %s", type(msg).__name__)

    def _flush_cache(self) -> bool:
        if not self.is_idle:
            return False
        self.state.kv.flush()
        return True

    # ---- reports and upkeep ----

    def stats_message(self) -> SchedulerStats:
        state = self.state
        return SchedulerStats(
            num_running=len(state.running) + len(state.prefilling),
            num_waiting=len(state.waiting),
            kv_used_tokens=(state.kv_pool.num_slots - state.kv_pool.num_free
                            - state.tree.evictable_size()),
            kv_total_tokens=state.kv_pool.num_slots, **state.stats)

    def check_slots(self) -> None:
        """Invariant: free + tree + held by live requests == total (call when consistent)."""
        self.state.check_slots()

    def model_info(self) -> dict:
        runner = self.runner
        return {
            "model_path": str(self.model_folder),
            "context_length": self.context_len,
            "max_total_tokens": self.state.kv_pool.num_slots,
            "max_running_requests": self.args.max_running_requests,
            "vocab_size": runner.vocab_size,
            "eos_token_ids": sorted(self.eos_ids),
            "dtype": str(runner.dtype).removeprefix("torch."),
            "quantization": runner.quantization,
            "device": str(runner.device),
            "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."),
            "cpu": runner.cpu_info(),
            "reasoning_parser": self.args.reasoning_parser,
            # --is-embedding: {pooling, normalize, hidden_size} (None: a generation server)
            "embedding": getattr(runner, "embedding_info", lambda: None)(),
            # the model's sampling defaults in force (--sampling-defaults), for request parsing
            "default_sampling_params": sampling_defaults(self.model_folder,
                                                         self.args.sampling_defaults),
        }

    def use_device_here(self) -> None:
        """Make the model's CUDA device the calling thread's: call first on a thread that
        runs step() (a new thread's is cuda:0; data-parallel replica k's weights are on
        cuda:k). The forward thread does it itself."""
        use_device(self.state.device)

    def shutdown(self) -> None:
        self.decode.shutdown()


def model_eos_ids(runner: ModelRunner, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids that end an output: the model config's EOS and the tokenizer's."""
    ids = set(runner.model_args.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def generation_config_eos_ids(model_folder: Path) -> set[int]:
    """The EOS ids of the folder's generation_config.json, if it has one."""
    gen_config = Path(model_folder) / "generation_config.json"
    if not gen_config.exists():
        return set()
    eos = json.loads(gen_config.read_text()).get("eos_token_id")
    return set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
