"""Drafts trimmed to the rows that pay: speculative/row_cost.py's line and choice, and
Speculate._worth_running over requests of different acceptance."""

from types import SimpleNamespace

import pytest

from radixflow.runtime.scheduler.speculate import DRIFT, PRIOR_RATE, Draft, Speculate
from radixflow.runtime.speculative.row_cost import RowCost


def _cost(fixed: float, per_row: float, rows=(1, 3, 5)) -> RowCost:
    cost = RowCost()
    for n in rows:
        cost.observe(n, fixed + per_row * n)
    return cost


def test_the_line_through_the_passes_seen():
    cost = RowCost()
    assert cost.line() is None
    cost.observe(1, 0.010)
    assert cost.line() is None  # one row count says nothing of a row's cost
    cost.observe(5, 0.030)
    assert cost.line() == pytest.approx((0.005, 0.005))
    cost.observe(5, 0.130)  # a slow pass moves that count's mean by a fifth of the way
    assert cost.means[5] == pytest.approx(0.050)
    cost.observe(0, 1.0)
    cost.observe(3, -1.0)
    assert set(cost.means) == {1, 5}


def test_every_row_while_the_cost_is_unknown():
    assert RowCost().rows_worth_drafting(1, [0.1, 0.01]) == 2


def test_a_cheap_row_is_always_worth_it():
    # a small model's step: the pass is mostly fixed cost
    assert _cost(0.010, 0.0001).rows_worth_drafting(1, [0.5, 0.25, 0.12, 0.06]) == 4


def test_a_row_that_costs_a_plain_rows_share_needs_a_sure_token():
    # compute-bound per row (a batch of 8 at avx2): a row is 1/8 of the pass, as a token is
    cost = _cost(0.0, 0.010, rows=(8, 16))
    assert cost.rows_worth_drafting(8, [0.5, 0.25]) == 0
    # sure ones run within the tolerance: 8 + 4 x 0.9 tokens in 12 rows is 0.97 of 8 in 8
    assert cost.rows_worth_drafting(8, [0.9] * 4 + [0.3] * 4) == 4
    assert cost.rows_worth_drafting(8, [1.0] * 6) == 6
    # one request at a 1B's avx2 costs (a row ~0.3 of a pass): the sure rows, not the rest
    one = _cost(0.010, 0.003)
    assert one.rows_worth_drafting(1, [0.9, 0.81, 0.73, 0.66]) == 4
    assert one.rows_worth_drafting(1, [0.3, 0.09, 0.03]) == 1


class _Req:  # (hashable, as the scheduler's requests are)
    def __init__(self, rate: float):
        self.spec = SimpleNamespace(rate=rate)


def test_the_best_accepted_rows_are_kept_as_prefixes():
    spec = Speculate.__new__(Speculate)  # (only its cost model and the drafts)
    spec.row_cost = _cost(0.010, 0.004, rows=(2, 4))
    good, poor = _Req(0.9), _Req(0.2)
    drafts = {good: Draft([1, 2, 3, 4], ["g0", "g1", "g2", "g3", "g4"], False),
              poor: Draft([5, 6, 7, 8], ["p0", "p1", "p2", "p3", "p4"], True)}
    kept = spec._worth_running(drafts, plain_rows=2)
    assert poor not in kept and good in kept
    draft = kept[good]
    n = len(draft.tokens)
    assert 1 <= n <= 4 and draft.tokens == [1, 2, 3, 4][:n]
    assert draft.states == ["g0", "g1", "g2", "g3", "g4"][:n + 1]
    assert poor.spec.rate == pytest.approx(0.2 + DRIFT * (PRIOR_RATE - 0.2))
    # while the cost is unknown every draft runs whole
    spec.row_cost = RowCost()
    assert spec._worth_running(drafts, plain_rows=2) == drafts


def test_the_rate_counts_the_drafted_tokens_a_verify_reached():
    """A span copied whole and then its end rejected: 3 of the 4 reached (the 4th, after
    the first rejection, never was) -- not 3 of the 6 drafted."""
    from radixflow.runtime.scheduler.speculate import RATE_WEIGHT, SpecState

    state = SpecState(drafter=None, max_k=6, k=6)
    state.rate = 0.5
    state.after_verify(drafted=6, accepted=3)
    assert state.rate == pytest.approx(0.5 + RATE_WEIGHT * (0.75 - 0.5))
    state.rate = 0.5
    state.after_verify(drafted=4, accepted=4)  # all reached, all accepted
    assert state.rate == pytest.approx(0.5 + RATE_WEIGHT * 0.5)
    state.rate = 0.5
    state.after_verify(drafted=4, accepted=0)
    assert state.rate == pytest.approx(0.5 - RATE_WEIGHT * 0.5)


def test_a_lone_requests_draft_is_never_cut():
    spec = Speculate.__new__(Speculate)
    spec.row_cost = _cost(0.0, 0.010, rows=(8, 16))  # rows as dear as tokens: a batch cuts
    poor = _Req(0.2)
    drafts = {poor: Draft([5, 6, 7], ["p0", "p1", "p2", "p3"], False)}
    assert spec._worth_running(drafts, plain_rows=1, requests=2) == {}
    assert spec._worth_running(drafts, plain_rows=1, requests=1) == drafts
