"""Budget-safe structured output: a constrained request always holds a completion of its output
that still fits its token budget, and closes with it rather than run out.

The invariant, per request once `start` succeeds: `witness` is a byte string that completes
the grammar from the output so far, and its tokens plus one EOS fit in the tokens left:

    tokens(witness) + 1 <= left        (left = max_new_tokens - generated, capped by context)

After each sampled token the closer looks for a witness of the new output that fits one token
less (`keep`): the old witness minus the token's bytes when the token follows it, the old
witness itself when it still completes the output (more of a string or a number), a greedy
completion, and last the shortest completion search finds (not when the witness is already
the shortest: the rest of a shortest completion after the token is the shortest after it).
If none fits, the sampled token is refused and the output ends with the previous witness's
tokens and EOS (`closing_tokens`), which fit by the invariant.

Tokens: tokens(w) <= len(w) bytes when every byte has a one-byte token (byte-level BPE, or
SentencePiece byte fallback), so a witness is tokenized only when its bytes do not fit, and
its tokens then follow it along (the whole tokens after a cut, one-byte tokens for the split
one) without calling the tokenizer again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .alphabet import Alphabet
from .completion import greedy_completion, shortest_completion
from .token_table import TokenTable

# The greedy witness is abandoned past this many bytes (the search takes over).
MAX_GREEDY_BYTES = 1024
# States a search may expand: at a request's start (once per grammar: shared), and on the
# decode path, where it runs only when no cheaper completion fits (near the budget's end).
START_EXPANSIONS = 1024
STEP_EXPANSIONS = 256

Encoder = Callable[[bytes], "list[int] | None"]


class BudgetCloser:
    """One request's witness. `matcher` arguments are the request's GrammarMatcher; the closer
    leaves them as it found them."""

    def __init__(self, alphabet: Alphabet, encode: Encoder, table: TokenTable):
        self.alphabet = alphabet
        self.encode = encode
        self.table = table
        self.witness: bytes | None = None  # None until start() succeeds
        self.tokens: list[int] | None = None  # tokens of exactly the witness's bytes, if known
        self.exact = False  # the witness is the shortest completion (search found it)
        self.num_searches = 0

    def start(self, matcher: Any, left: int, witness: bytes | None = None) -> bool:
        """Take `witness` (or search one) for the current output; False if none fits `left`
        tokens: then the closer cannot promise anything for this request."""
        exact = witness is None
        if witness is None:
            witness = self._search(matcher, None, START_EXPANSIONS)
            if witness is None:
                exact, witness = False, greedy_completion(matcher, self.alphabet,
                                                          MAX_GREEDY_BYTES)
        return witness is not None and self._take(witness, None, exact, left)

    def keep(self, matcher: Any, token_bytes: bytes, left: int) -> bool:
        """`matcher` has just accepted a sampled token (`token_bytes`); `left` is the tokens
        left after it. True: keep it (the witness now completes the new output). False: refuse
        it; the witness still completes the output before it."""
        old = self.witness
        if old.startswith(token_bytes):  # the token follows the witness: its rest completes
            found, tokens, exact = old[len(token_bytes):], self._drop(len(token_bytes)), self.exact
        elif _completes(matcher, old):  # more of a string or a number
            found, tokens, exact = old, self.tokens, False
        else:
            found, tokens, exact = greedy_completion(
                matcher, self.alphabet, min(MAX_GREEDY_BYTES, 2 * len(old) + 64)), None, False
        if found is not None and self._take(found, tokens, exact, left):
            return True
        if exact:  # the shortest completion does not fit: nothing does
            return False
        found = self._search(matcher, len(found) if found is not None else None,
                             STEP_EXPANSIONS)
        return found is not None and self._take(found, None, True, left)

    def after_jump(self, grown: bytes, left: int) -> bool:
        """Whether a jump-forward that adds `grown` bytes, leaving `left` tokens, keeps the
        invariant; if so the witness moves past them. (A forced text begins every completion,
        so the witness begins with it.)"""
        if not self.witness.startswith(grown):
            return False
        return self._take(self.witness[len(grown):], self._drop(len(grown)), self.exact, left)

    def fits(self, left: int) -> bool:
        """The invariant: tokens(witness) + 1 (EOS) <= left."""
        return self._take(self.witness, self.tokens, self.exact, left)

    def closing_tokens(self, matcher: Any) -> list[int] | None:
        """Tokens of the witness, checked against a fork of `matcher` to complete it."""
        for tokens in (self.tokens, self.encode(self.witness)):
            if tokens is None:
                continue
            probe = matcher.fork()
            if all(probe.accept_token(t) for t in tokens) and probe.is_completed():
                return tokens
        return None

    def _take(self, text: bytes, tokens: list[int] | None, exact: bool, left: int) -> bool:
        """Make `text` the witness if its tokens + EOS fit in `left`. Bytes bound tokens (a
        one-byte token per byte), so the tokenizer runs only when the bytes do not fit."""
        if len(text) + 1 > left and (tokens is None or len(tokens) + 1 > left):
            tokens = self.encode(text)
            if tokens is None or len(tokens) + 1 > left:
                return False
        self.witness, self.tokens, self.exact = text, tokens, exact
        return True

    def _drop(self, num_bytes: int) -> list[int] | None:
        """Tokens of witness[num_bytes:], from the witness's tokens: the whole tokens after the
        cut, and one-byte tokens for the rest of the one it splits."""
        if self.tokens is None:
            return None
        token_bytes, single = self.table.token_bytes, self.table.single_byte_ids
        for k, token in enumerate(self.tokens):
            size = len(token_bytes[token])
            if num_bytes < size:
                rest = token_bytes[token][num_bytes:]
                if not all(b in single for b in rest):
                    return None
                return [single[b] for b in rest] + self.tokens[k + 1:] if num_bytes else \
                    self.tokens[k:]
            num_bytes -= size
        return [] if num_bytes == 0 else None

    def _search(self, matcher: Any, upper: int | None, expansions: int) -> bytes | None:
        self.num_searches += 1
        return shortest_completion(matcher, self.alphabet, upper=upper,
                                   max_expansions=expansions)


def _completes(matcher: Any, text: bytes) -> bool:
    if not text:
        return matcher.is_completed()
    if not matcher.accept_string(text):
        return False
    done = matcher.is_completed()
    matcher.rollback(1)
    return done


def make_encoder(tokenizer: Any, table: TokenTable) -> Encoder:
    """bytes -> token ids whose bytes are exactly them: the tokenizer's own encoding when it
    round-trips, else one token per byte; None when neither exists."""
    def encode(data: bytes) -> list[int] | None:
        if not data:
            return []
        try:
            ids = tokenizer.encode(data.decode("utf-8"), add_special_tokens=False)
        except UnicodeDecodeError:
            ids = None
        if ids is not None and table.is_text(ids) and table.bytes_of(ids) == data:
            return list(ids)
        single = table.single_byte_ids
        if all(b in single for b in data):
            return [single[b] for b in data]
        return None

    return encode
