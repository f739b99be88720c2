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

Stops are searched once, in the scheduler (its `Req.stop_checker` is an IncrementalDetokenizer
with the stops); each of its outputs says how much of the text may be shown
(`ReqTokenOut.text_len`, see scheduler/output.py) and `Detokenizer` only applies that cut.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from .messages import Message, ReqTextOut, ReqTokenOut, TokenBatchOut
from .stop_search import StopSearch

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as decoding context for the first output tokens (as vLLM and SGLang do).
PROMPT_CONTEXT_TOKENS = 5
# A stop checker knows how long its text was after each of its last this many tokens
# (`text_len_at`): an output that holds tokens back (jump-forward holds
# scheduler/grammar.py's HOLD_BACK_TOKENS) is cut where the text of the tokens it sends ends.
TEXT_LENS_KEPT = 16


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

    A token holding part of a UTF-8 character decodes to U+FFFD, as in SGLang (OpenAI's
    routes give such a token's own bytes: token_bytes.py).
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
        Stop strings, searched only in the generated text (which wins: StopSearch).
    stop_regex:
        Stop regexes (`regex` syntax), searched only in the generated text: the output ends
        at the first match found, cut at the match's start like a stop string.
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
        self._stops = StopSearch(stop, stop_regex)
        self._skip_special_tokens = skip_special_tokens
        self._spaces_between_special_tokens = spaces_between_special_tokens
        self._no_stop_trim = no_stop_trim

        context = [int(i) for i in prompt_ids[len(prompt_ids) - PROMPT_CONTEXT_TOKENS :]]
        self._context_len = len(context)
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._prefix_text = self._decode(context) if context else ""
        self._committed = ""  # output text of ids[:read_offset]
        self._text = ""
        self._matched_stop: str | None = None
        self._matched_end: int | None = None  # where the matched stop ends in the text
        self._finished = False
        # (output tokens appended, len(text) then) after each of a stop checker's last tokens
        self._text_lens: deque[tuple[int, int]] = deque([(0, 0)], maxlen=TEXT_LENS_KEPT)

    @property
    def text(self) -> str:
        """Cumulative stable text (only ever grows by appending)."""
        return self._text

    @property
    def matched_stop(self) -> str | None:
        """The stop string (or stop regex pattern) that ended the output, or None."""
        return self._matched_stop

    @property
    def error(self) -> str | None:
        """Set when a stop regex took too long to search (its search is then given up)."""
        return self._stops.error

    @property
    def matched_end(self) -> int | None:
        """Where the matched stop ends in the decoded text (the text's end with
        no_stop_trim), or None."""
        return self._matched_end

    @property
    def num_tokens(self) -> int:
        """Output tokens appended so far (prompt context excluded)."""
        return len(self._ids) - self._context_len

    def text_len_at(self, num_tokens: int) -> int:
        """len(text) as it was right after the first `num_tokens` output tokens were appended:
        the text those tokens show whatever follows them. A stop checker knows it for its last
        TEXT_LENS_KEPT tokens (ValueError for older ones)."""
        if num_tokens >= self.num_tokens:
            return len(self._text)
        for count, length in reversed(self._text_lens):
            if count == num_tokens:
                return length
        raise ValueError(f"the text length after {num_tokens} tokens is no longer known "
                         f"(only after each of the last {TEXT_LENS_KEPT})")

    def append(self, new_ids: Sequence[int]) -> str:
        """Add output tokens; return the newly stable text (possibly "")."""
        if self._finished:
            raise RuntimeError("append() after finish()")
        if not self._stops.active:
            return self._append(new_ids)
        # A stop checker takes its last few tokens one at a time, to know text_len_at each.
        split = max(0, len(new_ids) - TEXT_LENS_KEPT)
        delta = self._append(new_ids[:split]) if split else ""
        for token in new_ids[split:]:
            if self._matched_stop is not None:
                break
            delta += self._append([token])
            self._text_lens.append((self.num_tokens, len(self._text)))
        return delta

    def finish_with(self, ids: Sequence[int]) -> str:
        """`finish`, once the whole output is `ids`: its tokens not appended yet (those that
        ended it unchecked: an EOS, a stop token id) are appended, and searched, first."""
        if not self._finished:
            self.append(ids[self.num_tokens:])
        return self.finish()

    def _append(self, new_ids: Sequence[int]) -> str:
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
        hit, stable_len = self._stops.search(candidate, final=final)
        if hit is not None:
            start, end, matched = hit
            self._matched_stop, self._matched_end = matched, end
            stable = candidate[: end if self._no_stop_trim else start]
        else:
            stable = candidate[:stable_len]
        if not stable.startswith(self._text):
            # Only a tokenizer whose windows decode unlike the full text gets here.
            logger.warning("detokenized text changed behind the stream; keeping the old text")
            return ""
        delta = stable[len(self._text) :]
        self._text = stable
        return delta


class Detokenizer:
    """Every running request's text, from the scheduler's outputs alone.

    A request's first output says how to decode its tokens (`ReqTokenOut.decode`); an output's
    `text_len`, when set, is how much of the text the scheduler's stop check lets through; its
    last output (a finish) ends it. Free of sockets: the detokenizer process and the
    in-process Engine both drive it.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}

    def handle(self, msg: Message) -> tuple[list[ReqTextOut], Message | None]:
        """(text outputs, a message to forward as is)."""
        if not isinstance(msg, TokenBatchOut):
            return [], msg
        texts = [self._text_out(out) for out in msg.outputs]
        return [t for t in texts if t is not None], None

    def _text_out(self, out: ReqTokenOut) -> ReqTextOut | None:
        if out.decode is not None:
            spec = out.decode
            self.states[out.rid] = IncrementalDetokenizer(
                self.tokenizer, skip_special_tokens=spec.skip_special_tokens,
                spaces_between_special_tokens=spec.spaces_between_special_tokens,
                prompt_ids=spec.context_ids)
        det = self.states.get(out.rid)
        if det is None:  # a scheduler bug: nothing of a request follows its finish
            logger.warning("dropping an output of request %s: it has no first output", out.rid)
            return None
        det.append(out.new_ids)
        if out.finish is not None:
            det.finish()
            del self.states[out.rid]
        text = det.text if out.text_len is None else det.text[:out.text_len]
        return ReqTextOut(token=out, text=text)
