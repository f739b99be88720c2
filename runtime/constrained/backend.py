"""GrammarBackend: one per tokenizer. Compiles prepared constraints (cached), makes a
GrammarState per request, and fills the batch's token bitmask (radixflow.kernels.bitmask
applies it)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
import xgrammar as xgr

from .alphabet import Alphabet, byte_alphabet
from .closing import BudgetCloser, make_encoder
from .compile_cache import CompileCache, PendingGrammar
from .constraint import Constraint
from .front_door import prepare
from .grammar_build import compile_constraint
from .limits import GrammarLimits
from .repeat_guard import RepeatGuard
from .state import GrammarState
from .token_table import TokenTable, int32_bit
from .xgrammar_compat import XGRAMMAR_VERSION, unmeasured_version

logger = logging.getLogger(__name__)

CompiledGrammar = xgr.CompiledGrammar


class GrammarBackend:
    """Constrained decoding for one tokenizer.

    Parameters
    ----------
    tokenizer : a Hugging Face tokenizer.
    vocab_size : the model's logits width (may exceed len(tokenizer)); the bitmask width.
    compile_timeout : seconds before a compile is abandoned (GrammarError); its thread is
        handed off and replaced (compile_cache.py).
    max_threads : xgrammar's threads, and threads filling a batch's bitmask.
    compile_threads : threads compiling constraints at once (default: max_threads).
    stop_token_ids : tokens that end a constrained output (default: the tokenizer's EOS).
    limits : size limits against grammar bombs.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, *, compile_timeout: float = 10.0,
                 max_threads: int = 2, compile_threads: int | None = None,
                 stop_token_ids: list[int] | None = None,
                 limits: GrammarLimits | None = None):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.limits = limits or GrammarLimits()
        self.tokenizer_info = build_tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        self.stop_token_ids = list(self.tokenizer_info.stop_token_ids)
        self.table = TokenTable(self.tokenizer_info)
        # The token table takes ~0.5 s for a 50k vocab; build it before the first jump needs it.
        threading.Thread(target=self.table.warm, name="grammar-token-table", daemon=True).start()
        # Our cache below replaces xgrammar's, so a hit is visible and the memory bounded.
        self._compiler = xgr.GrammarCompiler(self.tokenizer_info, max_threads=max_threads,
                                             cache_enabled=False)
        self._cache = CompileCache(self._compile, timeout=compile_timeout,
                                   max_workers=compile_threads or max_threads,
                                   size_fn=lambda compiled: compiled.memory_size_bytes)
        self._batch_matcher = xgr.BatchGrammarMatcher(max_threads)
        self._fill_pool: ThreadPoolExecutor | None = None
        self._alphabets: OrderedDict[int, tuple[CompiledGrammar, Alphabet]] = OrderedDict()
        self._encode = make_encoder(tokenizer, self.table)
        self.repeat_guard = RepeatGuard(self.table)
        if unmeasured_version() is not None:
            logger.warning("xgrammar %s is installed; its workarounds were measured against "
                           "%s (runtime/constrained/xgrammar_compat says what to re-measure)",
                           unmeasured_version(), XGRAMMAR_VERSION)

    # ---- constraints ----

    def submit_prepared(self, constraint: Constraint) -> PendingGrammar:
        """Compile a prepared constraint as it is, on a compile thread (or hit the cache):
        the caller's thread (the scheduler's loop) does no work. The PendingGrammar's result()
        raises GrammarError for a compile error or a timeout; submit_prepared itself raises it
        (a 503) only when compiles past their deadline fill their cap."""
        return self._cache.submit(constraint)

    def validate(self, kind: str, spec: str) -> None:
        """The front door's checks with this backend's limits (prepare: once per distinct
        constraint in this process); raise GrammarError (a 400) naming the problem."""
        prepare(kind, spec, self.limits)

    def submit(self, kind: str, spec: str) -> PendingGrammar:
        """For a raw (kind, spec) that no front door prepared (tests, benchmarks, requests
        built by hand): prepare, then compile, on a compile thread (submit_prepared)."""
        return self._cache.submit((kind, spec), check=lambda: self.validate(kind, spec))

    def compile(self, kind: str, spec: str) -> CompiledGrammar:
        """The compiled grammar of a raw (kind, spec), prepared here. Raises GrammarError."""
        return self.submit(kind, spec).result()

    @property
    def num_compiles(self) -> int:
        """Compiles started so far (cache hits add none)."""
        return self._cache.num_compiles

    def cache_stats(self) -> dict:
        """The compile cache, for the /dashboard: entries, hits, compiles."""
        return {"entries": len(self._cache), "hits": self._cache.num_hits,
                "compiles": self._cache.num_compiles}

    def new_state(self, compiled: CompiledGrammar, *, budget_safe: bool = False) -> GrammarState:
        """A request's state; with `budget_safe`, it carries a BudgetCloser (closing.py)."""
        state = GrammarState(xgr.GrammarMatcher(compiled), self.table)
        if budget_safe:
            state.closer = BudgetCloser(self.alphabet(compiled), self._encode, self.table)
        return state

    def alphabet(self, compiled: CompiledGrammar) -> Alphabet:
        """The grammar's byte classes (completion.py), kept for the last 64 grammars."""
        key = id(compiled)
        entry = self._alphabets.get(key)
        if entry is None or entry[0] is not compiled:
            entry = (compiled, byte_alphabet(compiled.grammar))
            self._alphabets[key] = entry
            if len(self._alphabets) > 64:
                self._alphabets.popitem(last=False)
        self._alphabets.move_to_end(key)
        return entry[1]

    # ---- bitmasks ----

    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        """All-allowed int32 bitmask [batch_size, ceil(vocab_size / 32)] on CPU."""
        return xgr.allocate_token_bitmask(batch_size, self.vocab_size)

    def fill_bitmasks(self, states: list[GrammarState | None], bitmask: torch.Tensor) -> None:
        """Fill row i for each states[i] that is not None; other rows are left as they are."""
        rows, matchers = [], []
        first_row: dict[int, int] = {}  # id(matcher) -> the row it fills
        copies: list[tuple[int, int]] = []  # (row, row to copy from)
        for row, state in enumerate(states):
            if state is None:
                continue
            if state.is_terminated():  # nothing may follow: allow only the stop tokens
                self._fill_stop_only(bitmask, row)
                continue
            # NOTE: one matcher filled twice in a batch would run on two threads at once
            # (xgrammar aborts the process); fill it once and copy its row.
            if id(state.matcher) in first_row:
                copies.append((row, first_row[id(state.matcher)]))
                continue
            first_row[id(state.matcher)] = row
            rows.append(row)
            matchers.append(state.matcher)
        if len(rows) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, rows[0])
        elif rows:
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask, rows)
        for row, source in copies:
            bitmask[row].copy_(bitmask[source])

    def fill_bitmasks_async(self, states: list[GrammarState | None], bitmask: torch.Tensor,
                            after: Callable[[], None] | None = None) -> Future:
        """fill_bitmasks on a worker thread (xgrammar releases the GIL), to overlap with the
        model's forward, then `after()` there. Do not touch these states until the future is
        done."""
        if self._fill_pool is None:
            self._fill_pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-fill")
        if after is None:
            return self._fill_pool.submit(self.fill_bitmasks, states, bitmask)

        def fill_then() -> None:
            self.fill_bitmasks(states, bitmask)
            after()

        return self._fill_pool.submit(fill_then)

    def wait_fills(self, timeout: float = 60.0) -> None:
        """Wait for the bitmask fills submitted so far (they read their states)."""
        if self._fill_pool is not None:
            with contextlib.suppress(Exception):  # a shut-down pool, a fill past the timeout
                self._fill_pool.submit(lambda: None).result(timeout=timeout)

    def shutdown(self) -> None:
        self._cache.shutdown()
        if self._fill_pool is not None:
            self._fill_pool.shutdown(wait=False)

    # ---- internals ----

    def _compile(self, key: Constraint | tuple[str, str]) -> CompiledGrammar:
        """A cache key's grammar: a prepared Constraint, or a raw (kind, spec) that submit's
        check has just prepared (so this prepare is a cache hit)."""
        constraint = key if isinstance(key, Constraint) else prepare(*key, self.limits)
        return compile_constraint(self._compiler, constraint)

    def _fill_stop_only(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        for stop_id in self.stop_token_ids:
            word, bit = divmod(stop_id, 32)
            bitmask[row, word] |= int32_bit(bit)


# Special tokens that stay text: tool-call markers a grammar spells out (Mistral's), so the
# model can write them as the one token it was trained to.
MARKER_TOKENS = frozenset({"[TOOL_CALLS]", "[ARGS]"})


def build_tokenizer_info(tokenizer: Any, vocab_size: int,
                         stop_token_ids: list[int] | None = None) -> xgr.TokenizerInfo:
    """xgrammar's TokenizerInfo with the tokenizer's special tokens marked as non-text.

    NOTE: with transformers 5, xgrammar reads special tokens such as <|im_start|> as their
    literal text, so a grammar allowing '<' could emit them; blank strings mark them special.
    """
    if stop_token_ids is None:
        eos = getattr(tokenizer, "eos_token_id", None)
        stop_token_ids = [eos] if eos is not None else None
    detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids)
    encoded = [""] * vocab_size
    for token, token_id in tokenizer.get_vocab().items():
        if token_id < vocab_size:
            encoded[token_id] = token
    special = set(getattr(tokenizer, "all_special_ids", []))
    special.update(token_id for token_id, added in
                   getattr(tokenizer, "added_tokens_decoder", {}).items()
                   if getattr(added, "special", False))
    for token_id in special:
        if 0 <= token_id < vocab_size and encoded[token_id] not in MARKER_TOKENS:
            encoded[token_id] = ""
    return xgr.TokenizerInfo(encoded, detected.vocab_type, vocab_size=vocab_size,
                             stop_token_ids=list(detected.stop_token_ids),
                             add_prefix_space=detected.add_prefix_space)
