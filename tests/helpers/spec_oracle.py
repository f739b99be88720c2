"""A drafter for speculative decoding's tests: it knows each prompt's continuation."""

from __future__ import annotations


class Oracle:
    """A drafter that knows each prompt's greedy continuation: `wrong_at` (per draft) makes
    that drafted token wrong, so a verify pass accepts exactly the tokens before it."""

    futures: list[list[int]] = []
    wrong_at: int | None = None

    def __init__(self, *args, **kwargs):
        pass

    def draft(self, tokens: list[int], k: int) -> tuple[list[int], bool]:
        for seq in self.futures:
            if seq[:len(tokens)] == tokens:
                nxt = list(seq[len(tokens):len(tokens) + k])
                if self.wrong_at is not None and self.wrong_at < len(nxt):
                    nxt[self.wrong_at] = (nxt[self.wrong_at] + 1) % 300 + 3
                return nxt, False
        return [], False


def every_draft_runs(monkeypatch) -> None:
    """Keep every draft whatever the learned pass cost says (speculative/row_cost.py): tests of
    the verify itself must not depend on this machine's timings."""
    from radixflow.runtime.speculative.row_cost import RowCost

    monkeypatch.setattr(RowCost, "rows_worth_drafting",
                        lambda self, plain_rows, gains: len(gains))
