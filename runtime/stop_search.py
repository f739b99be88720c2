"""Where a growing output text meets its stop strings and stop regexes (`StopSearch`).

IncrementalDetokenizer asks it, after each append, which stop (if any) ends the text and how
much of the text is safe to show: a suffix that could still become a stop string is held back,
and so is text that an unfinished match of a stop regex covers (the `regex` package's partial
matching). Each call searches only what the text gained since the last one.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

# One stop_regex search may take this long; a slower pattern (catastrophic backtracking) ends
# the request instead of stalling the scheduler (see StopSearch.error).
REGEX_TIMEOUT_S = 0.05

# (start, end, the stop string or regex pattern) of a stop in the text
Hit = tuple[int, int, str]


class StopSearch:
    """The stops of one request, searched incrementally in its (growing) text.

    `stop`: strings; the earliest occurrence wins (at equal positions, the shorter string,
    which completes first). `stop_regex`: patterns; the earliest match wins among those
    complete at once; a stop string that may still complete earlier is waited for, a regex
    that may still match earlier is not (it could wait forever: ``a.*z``), but the text it
    could match is held back.
    """

    def __init__(self, stop: Sequence[str] = (), stop_regex: Sequence[str] = ()):
        self._stop = tuple(s for s in stop if s)
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self._regexes = [regex.compile(p) for p in stop_regex]
        # Per regex: no match can start before this position of the text (it was searched
        # with partial matching and nothing, not even an unfinished match, started there).
        self._regex_from = [0] * len(self._regexes)
        self._searched_len = 0  # how much of the text was searched for stop strings
        self.error: str | None = None  # set when a stop regex took too long to search

    @property
    def active(self) -> bool:
        """Whether there is anything to search for."""
        return bool(self._stop or self._regexes)

    def search(self, text: str, *, final: bool) -> tuple[Hit | None, int]:
        """(the stop that ends `text`, or None; otherwise how much of it is stable).

        `final`: no more text will come, so nothing is held back for a stop that may still
        complete."""
        held = 0 if final else self._held_back_len(text)
        hits = [h for h in (self._find_stop(text), self._find_regex(text, final))
                if h is not None]
        hit = min(hits, default=None)  # the earliest, then the shortest
        # A stop string that starts before the found hit may still complete: wait for it,
        # so the earliest occurrence wins however the text was split into tokens.
        if hit is not None and len(text) - held >= hit[0]:
            return hit, hit[0]
        return None, min(len(text) - held, self._regex_held_from(text))

    def _find_stop(self, text: str) -> Hit | None:
        """Earliest stop string in the part of `text` not searched before."""
        if not self._stop:
            return None
        # A new occurrence must end in the new text, so it starts at most
        # max_stop_len - 1 characters before it.
        search_from = max(0, self._searched_len - self._max_stop_len + 1)
        self._searched_len = len(text)
        best: Hit | None = None
        for stop in self._stop:
            start = text.find(stop, search_from)
            if start >= 0 and (best is None or (start, start + len(stop)) < best[:2]):
                best = (start, start + len(stop), stop)
        return best

    def _find_regex(self, text: str, final: bool) -> Hit | None:
        """Earliest complete stop-regex match in `text`.

        Moves each regex's `_regex_from` up to where its earliest unfinished match starts
        (partial matching), or to the end of the text when none can start anywhere."""
        best: Hit | None = None
        for i, rx in enumerate(self._regexes):
            try:
                m = rx.search(text, self._regex_from[i], partial=not final,
                              timeout=REGEX_TIMEOUT_S)
                if m is not None and m.partial:
                    self._regex_from[i] = m.start()
                    # a complete match may start later than the unfinished one
                    m = rx.search(text, m.start() + 1, timeout=REGEX_TIMEOUT_S)
                elif m is None:
                    self._regex_from[i] = len(text)
            except TimeoutError:
                self.error = (f"stop_regex {rx.pattern!r} took longer than "
                              f"{REGEX_TIMEOUT_S:g} s to search the output")
                self._regexes, self._regex_from = [], []
                return None
            if m is not None and (best is None or (m.start(), m.end()) < best[:2]):
                best = (m.start(), m.end(), rx.pattern)
        return best

    def _regex_held_from(self, text: str) -> int:
        """Where the text a stop regex could still match starts (len(text): nowhere)."""
        return min(self._regex_from, default=len(text))

    def _held_back_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop."""
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:size]):
                    held = size
                    break
        return held
