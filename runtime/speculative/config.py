"""The server's speculation settings (--speculative-*), checked once at start-up."""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("ngram",)
MAX_DRAFT_TOKENS = 16  # drafted tokens verified per request and step, at most
MAX_WINDOW = 32


@dataclass(frozen=True)
class SpeculationConfig:
    """`on`: requests speculate unless they say otherwise (a request may turn it on or off
    with its own field); the sizes apply to every request that speculates."""

    on: bool = False
    num_draft_tokens: int = 4
    # drafts from a request's prediction are accepted nearly whole, so they may run longer
    prediction_draft_tokens: int = MAX_DRAFT_TOKENS
    min_window: int = 2
    max_window: int = 5

    @classmethod
    def from_args(cls, args) -> SpeculationConfig:
        algorithm = args.speculative_algorithm
        if algorithm is not None and algorithm.lower() not in ALGORITHMS:
            raise ValueError(f"--speculative-algorithm {algorithm!r} is not one radixflow runs: "
                             f"{', '.join(ALGORITHMS)} (drafts from the request's own n-grams "
                             "and its prediction; no draft model)")
        k = args.speculative_num_draft_tokens
        if not 1 <= k <= MAX_DRAFT_TOKENS:
            raise ValueError(f"--speculative-num-draft-tokens must be in [1, "
                             f"{MAX_DRAFT_TOKENS}], got {k}")
        from_prediction = args.speculative_prediction_draft_tokens
        if not 1 <= from_prediction <= MAX_DRAFT_TOKENS:
            raise ValueError(f"--speculative-prediction-draft-tokens must be in [1, "
                             f"{MAX_DRAFT_TOKENS}], got {from_prediction}")
        low = args.speculative_ngram_min_match_window_size
        high = args.speculative_ngram_max_match_window_size
        if not 1 <= low <= high <= MAX_WINDOW:
            raise ValueError("n-gram match windows must satisfy 1 <= "
                             "--speculative-ngram-min-match-window-size <= "
                             f"--speculative-ngram-max-match-window-size <= {MAX_WINDOW}, "
                             f"got {low} and {high}")
        return cls(on=algorithm is not None, num_draft_tokens=k,
                   prediction_draft_tokens=from_prediction, min_window=low, max_window=high)

    def longest_draft(self, from_prediction: bool) -> int:
        return self.prediction_draft_tokens if from_prediction else self.num_draft_tokens
