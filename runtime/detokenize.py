"""Token ids -> text, with exact stop-string cutting: `IncrementalDetokenizer` for one
request, `Detokenizer` for every request of a server or Engine.

Each `append` decodes only a short window of tokens (vLLM / SGLang style): `prefix_offset`
marks where the window starts (a few tokens of context, so merges and leading spaces decode
as they do inside the full text) and `read_offset` where the already-committed text ends.
The new text is decode(window) minus decode(context). While it ends in U+FFFD (an incomplete
UTF-8 sequence of a byte-level BPE) the offsets stay put and only the part before the
replacement characters is offered.

    ids:   ... | context (decoded before) | new tokens |
               ^ prefix_offset            ^ read_offset

The public text only ever grows by appending; it holds back any suffix that could still
become a stop string or a match of a stop regex (the `regex` package's partial matching), and
stops growing for good once a stop string or a regex match appears.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import regex

from .messages import AbortReq, GenerateReq, Message, ReqTextOut, ReqTokenOut, TokenBatchOut

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as decoding context for the first output tokens (as vLLM and SGLang do).
PROMPT_CONTEXT_TOKENS = 5
PENDING_TIMEOUT_S = 60.0
FORGET_ABORTED = 10_000  # how many aborted rids to remember, to drop their late outputs
# One stop_regex search may take this long; a slower pattern (catastrophic backtracking) ends
# the request instead of stalling the scheduler (see IncrementalDetokenizer.error).
REGEX_TIMEOUT_S = 0.05


def _decode(tokenizer: Any, ids: Sequence[int], skip_special_tokens: bool,
            spaces_between_special_tokens: bool = True) -> str:
    # NOTE: cleanup (" ." -> ".") would make a window's text differ from the full text's.
    # spaces_between_special_tokens is SGLang's pass-through to the tokenizer (HF fast
    # tokenizers have no such option and ignore it, as they do in SGLang).
    kwargs = {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
    return tokenizer.decode(
        list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False,
        **kwargs)


def decode_token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token decoded on its own (special tokens included), e.g. for logprob token texts.

    A token holding part of a UTF-8 character decodes to U+FFFD, as in SGLang and OpenAI.
    """
    if not ids:
        return []
    return tokenizer.batch_decode(
        [[int(i)] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, a delta per `append`.

    Parameters
    ----------
    tokenizer:
        A Hugging Face tokenizer (anything with `decode(ids, skip_special_tokens=...,
        clean_up_tokenization_spaces=...)`).
    stop:
        Stop strings, searched only in the generated text; the earliest occurrence wins
        (at equal positions, the shorter string, which completes first).
    stop_regex:
        Stop regexes (`regex` syntax), searched only in the generated text: the output ends
        at the first match found, cut at the match's start like a stop string. The earliest
        match wins among those complete at once; a stop string that may still complete
        earlier is waited for, a regex that may still match earlier is not (it could wait
        forever: ``a.*z``), but the text it could match is held back from the stream.
    skip_special_tokens:
        Leave special tokens (e.g. ``<|im_end|>``) out of the text.
    spaces_between_special_tokens:
        Passed to the tokenizer's decode when False (a slow HF tokenizer's option).
    no_stop_trim:
        Keep the matched stop string (or regex match) at the end of the text instead of
        cutting it off.
    prompt_ids:
        The prompt; its last few tokens are decoding context only, never part of the text.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop: Sequence[str] = (),
        stop_regex: Sequence[str] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        no_stop_trim: bool = False,
        prompt_ids: Sequence[int] = (),
    ):
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self._regexes = [regex.compile(p) for p in stop_regex]
        # Per regex: no match can start before this position of the text (it was searched
        # with partial matching and nothing, not even an unfinished match, started there).
        self._regex_from = [0] * len(self._regexes)
        self._skip_special_tokens = skip_special_tokens
        self._spaces_between_special_tokens = spaces_between_special_tokens
        self._no_stop_trim = no_stop_trim
        self.error: str | None = None  # set when a stop regex took too long to search

        context = [int(i) for i in prompt_ids[len(prompt_ids) - PROMPT_CONTEXT_TOKENS :]]
        self._context_len = len(context)
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = self._decode(context) if context else ""
        self._committed = ""  # output text of ids[:read_offset]
        self._searched_len = 0  # how much of the candidate text was searched for stops
        self._text = ""
        self._matched_stop: str | None = None
        self._finished = False

    @property
    def text(self) -> str:
        """Cumulative stable text (only ever grows by appending)."""
        return self._text

    @property
    def matched_stop(self) -> str | None:
        """The stop string (or stop regex pattern) that ended the output, or None."""
        return self._matched_stop

    @property
    def num_tokens(self) -> int:
        """Output tokens appended so far (prompt context excluded)."""
        return len(self._ids) - self._context_len

    def append(self, new_ids: Sequence[int]) -> str:
        """Add output tokens; return the newly stable text (possibly "")."""
        if self._finished:
            raise RuntimeError("append() after finish()")
        if self._matched_stop is not None or not new_ids:
            return ""
        self._ids.extend(int(i) for i in new_ids)
        new_text = self._window_text()
        if new_text and not new_text.endswith(REPLACEMENT_CHAR):
            self._committed += new_text
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            self._prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
            candidate = self._committed
        else:
            candidate = self._committed + new_text.rstrip(REPLACEMENT_CHAR)
        return self._publish(candidate, final=False)

    def finish(self) -> str:
        """The final text: held-back characters flushed, a completed stop string still cut."""
        if not self._finished and self._matched_stop is None:
            self._publish(self._committed + self._window_text(), final=True)
        self._finished = True
        return self._text

    def _decode(self, ids: Sequence[int]) -> str:
        return _decode(self._tokenizer, ids, self._skip_special_tokens,
                       self._spaces_between_special_tokens)

    def _window_text(self) -> str:
        """Text of the tokens after read_offset, as they decode after their context."""
        window = self._decode(self._ids[self._prefix_offset :])
        if len(window) <= len(self._prefix_text):
            return ""
        return window[len(self._prefix_text) :]

    def _publish(self, candidate: str, *, final: bool) -> str:
        """Make `candidate`'s stable part the public text; return what was added."""
        held = 0 if final else self._held_back_len(candidate)
        hits = [h for h in (self._find_stop(candidate), self._find_regex(candidate, final))
                if h is not None]
        hit = min(hits, default=None)  # (start, end, matched): the earliest, then the shortest
        # A stop string that starts before the found hit may still complete: wait for it,
        # so the earliest occurrence wins however the text was split into tokens.
        if hit is not None and len(candidate) - held >= hit[0]:
            start, end, matched = hit
            self._matched_stop = matched
            stable = candidate[: end if self._no_stop_trim else start]
        else:
            stable = candidate[: min(len(candidate) - held, self._regex_held_from(candidate))]
        if not stable.startswith(self._text):
            # Only a tokenizer whose windows decode unlike the full text gets here.
            logger.warning("detokenized text changed behind the stream; keeping the old text")
            return ""
        delta = stable[len(self._text) :]
        self._text = stable
        return delta

    def _find_stop(self, candidate: str) -> tuple[int, int, str] | None:
        """Earliest stop string in the part of `candidate` not searched before:
        (start, end, stop)."""
        if not self._stop:
            return None
        # A new occurrence must end in the new text, so it starts at most
        # max_stop_len - 1 characters before it.
        search_from = max(0, self._searched_len - self._max_stop_len + 1)
        self._searched_len = len(candidate)
        best: tuple[int, int, str] | None = None
        for stop in self._stop:
            start = candidate.find(stop, search_from)
            if start >= 0 and (best is None or (start, start + len(stop)) < best[:2]):
                best = (start, start + len(stop), stop)
        return best

    def _find_regex(self, candidate: str, final: bool) -> tuple[int, int, str] | None:
        """Earliest complete stop-regex match in `candidate`: (start, end, pattern).

        Moves each regex's `_regex_from` up to where its earliest unfinished match starts
        (partial matching), or to the end of the text when none can start anywhere."""
        best: tuple[int, int, str] | None = None
        for i, rx in enumerate(self._regexes):
            try:
                m = rx.search(candidate, self._regex_from[i], partial=not final,
                              timeout=REGEX_TIMEOUT_S)
                if m is not None and m.partial:
                    self._regex_from[i] = m.start()
                    # a complete match may start later than the unfinished one
                    m = rx.search(candidate, m.start() + 1, timeout=REGEX_TIMEOUT_S)
                elif m is None:
                    self._regex_from[i] = len(candidate)
            except TimeoutError:
                self.error = (f"stop_regex {rx.pattern!r} took longer than "
                              f"{REGEX_TIMEOUT_S:g} s to search the output")
                self._regexes, self._regex_from = [], []
                return None
            if m is not None and (best is None or (m.start(), m.end()) < best[:2]):
                best = (m.start(), m.end(), rx.pattern)
        return best

    def _regex_held_from(self, candidate: str) -> int:
        """Where the text a stop regex could still match starts (len(candidate): nowhere)."""
        return min(self._regex_from, default=len(candidate))

    def _held_back_len(self, candidate: str) -> int:
        """Length of the longest suffix of `candidate` that is a proper prefix of a stop."""
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(candidate)), held, -1):
                if candidate.endswith(stop[:size]):
                    held = size
                    break
        return held


class Detokenizer:
    """Every request's IncrementalDetokenizer, fed the same messages the scheduler gets.

    A request is announced by its GenerateReq (stop strings, prompt context); outputs that
    overtake their announcement wait in `pending`. Free of sockets: the detokenizer process
    and the in-process Engine both drive it.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}
        self.pending: dict[str, tuple[float, list[ReqTokenOut]]] = {}
        self.aborted: OrderedDict[str, None] = OrderedDict()

    def handle(self, msg: Message) -> tuple[list[ReqTextOut], Message | None]:
        """(text outputs, a message to forward as is)."""
        if isinstance(msg, GenerateReq):
            s = msg.sampling
            self.states[msg.rid] = IncrementalDetokenizer(
                self.tokenizer, stop=list(s.stop), stop_regex=list(s.stop_regex),
                skip_special_tokens=s.skip_special_tokens,
                spaces_between_special_tokens=s.spaces_between_special_tokens,
                no_stop_trim=s.no_stop_trim, prompt_ids=msg.input_ids)
            _, early = self.pending.pop(msg.rid, (0.0, []))
            return [self._text_out(o) for o in early], None
        if isinstance(msg, AbortReq):
            self.states.pop(msg.rid, None)
            self.pending.pop(msg.rid, None)
            self.aborted[msg.rid] = None
            if len(self.aborted) > FORGET_ABORTED:
                self.aborted.popitem(last=False)
            return [], None
        if isinstance(msg, TokenBatchOut):
            outs = []
            for out in msg.outputs:
                if out.rid in self.states:
                    outs.append(self._text_out(out))
                elif out.rid not in self.aborted:
                    self.pending.setdefault(out.rid, (time.monotonic(), []))[1].append(out)
            self._expire_pending()
            return outs, None
        return [], msg

    def _text_out(self, out: ReqTokenOut) -> ReqTextOut:
        det = self.states[out.rid]
        det.append(out.new_ids)
        if out.finish is not None:
            det.finish()
            del self.states[out.rid]
        return ReqTextOut(token=out, text=det.text)

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for rid in [r for r, (t, _) in self.pending.items() if now - t > PENDING_TIMEOUT_S]:
            logger.warning("dropping outputs of request %s: it was never announced", rid)
            del self.pending[rid]
