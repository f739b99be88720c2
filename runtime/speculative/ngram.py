"""Drafts from n-gram matches: the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (prompt lookup, as vLLM's `ngram` method and llama.cpp's lookup
decoding). A request's drafter indexes its tokens incrementally, so a step costs a few dict
operations however long the prompt is.

With a prediction (the text the client expects, OpenAI's Predicted Outputs), the output is first
followed along it: while the output so far is the prediction's prefix, the draft is the
prediction's next tokens; once they part, the prediction is one more place to look for n-grams,
searched before the sequence itself.
"""

from __future__ import annotations


class _NgramIndex:
    """For n in [min_n, max_n]: n-gram -> the end of its latest occurrence in `tokens` that
    has a token after it."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.latest: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this are in `latest`

    def update(self, tokens: list[int], end: int) -> None:
        """Index the n-grams ending at positions indexed+1 .. end (exclusive end positions)."""
        latest = self.latest
        for stop in range(max(self.indexed, self.min_n), end + 1):
            for n in range(self.min_n, min(self.max_n, stop) + 1):
                latest[tuple(tokens[stop - n:stop])] = stop
        self.indexed = max(self.indexed, end + 1)

    def find(self, suffix: list[int]) -> int | None:
        """Where the continuation of the longest indexed n-gram ending `suffix` starts."""
        for n in range(min(self.max_n, len(suffix)), self.min_n - 1, -1):
            at = self.latest.get(tuple(suffix[len(suffix) - n:]))
            if at is not None:
                return at
        return None


class NgramDrafter:
    """One request's drafter. `draft(tokens, k)`: up to k tokens likely to follow `tokens`
    (the request's prompt + output, which only grows or is cut back at its end), and whether
    they came from the prediction."""

    def __init__(self, min_n: int, max_n: int, prediction: list[int] | None = None,
                 num_output_start: int = 0):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.own = _NgramIndex(min_n, max_n)
        self.prediction = prediction or []
        self.output_start = num_output_start  # where the output begins in `tokens`
        self.on_prediction = bool(self.prediction)  # the output so far is its prefix
        self.predicted = None
        if self.prediction:
            self.predicted = _NgramIndex(min_n, max_n)
            self.predicted.update(self.prediction, len(self.prediction) - 1)

    def draft(self, tokens: list[int], k: int) -> tuple[list[int], bool]:
        if k <= 0:
            return [], False
        if self.on_prediction:
            done = len(tokens) - self.output_start
            if 0 <= done < len(self.prediction) and \
                    tokens[self.output_start:] == self.prediction[:done]:
                return self.prediction[done:done + k], True
            self.on_prediction = False
        suffix = tokens[-self.max_n:]
        if self.predicted is not None:
            at = self.predicted.find(suffix)
            if at is not None:
                return self.prediction[at:at + k], True
        own = self.own
        if own.indexed > len(tokens):  # the sequence was cut back: index it anew
            self.own = own = _NgramIndex(self.min_n, self.max_n)
        own.update(tokens, len(tokens) - 1)
        at = own.find(suffix)
        return ([] if at is None else tokens[at:at + k]), False
