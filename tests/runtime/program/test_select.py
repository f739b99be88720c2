from __future__ import annotations

import pytest
from helpers.fake_backend import FakeBackend

from radixflow.runtime.program.select import choice_token_entries, select_choice


def test_choice_tokens_are_found_from_the_end_of_the_window():
    # window: [unscored prompt token, last prompt token, choice tokens...]
    entries = [[None, 1, "A"], [-0.5, 2, ":"], [-1.0, 3, " Par"], [-0.2, 4, "is"]]
    assert choice_token_entries(entries, " Paris") == entries[2:]
    # tokenisation merged the prompt's last token with the choice: that token belongs to it
    merged = [[None, 1, "A"], [-0.7, 5, ": Par"], [-0.2, 4, "is"]]
    assert choice_token_entries(merged, " Paris") == merged[1:]
    # no token text from the server: everything after the prompt's last token
    blind = [[None, 1, None], [-0.5, 2, None], [-1.0, 3, None]]
    assert choice_token_entries(blind, "x") == blind[2:]


def _backend():
    # "cat" is likely token by token; "caterpillar" is long but every extra char is likely too.
    table = {"c": -1.0, "a": -0.1, "t": -0.1, "d": -3.0, "o": -0.5, "g": -0.5}
    return FakeBackend(logprob=lambda prefix, c: table.get(c, -0.05))


def test_mean_sum_and_unconditional_scores():
    fake = _backend()
    best, meta, n = select_choice(fake.generate_from_body, "Pet: ", ["cat", "dog", "caterpillar"])
    assert n == 2 and meta["method"] == "token_length_normalized"
    lengths = [len(e) for e in meta["input_token_logprobs"]]
    assert lengths == [3, 3, 11]
    assert meta["scores"][0] == pytest.approx(-1.2 / 3)
    assert meta["choices"][best] == "caterpillar"  # mean favours long easy tails

    best, meta, _ = select_choice(fake.generate_from_body, "Pet: ", ["cat", "dog", "caterpillar"],
                                  "sum")
    assert meta["choices"][best] == "cat" and meta["scores"][0] == pytest.approx(-1.2)

    best, meta, n = select_choice(fake.generate_from_body, "Pet: ", ["cat", "dog"],
                                  "unconditional_likelihood_normalized")
    assert n == 3
    # the fake's logprobs ignore context, so conditional minus unconditional is 0 except
    # the first token, which has no unconditional score (taken as 0, as SGLang does)
    assert meta["scores"] == pytest.approx([-1.0 / 3, -3.0 / 3])
    assert best == 0


def test_prefix_is_prefilled_once_then_one_batched_request():
    fake = _backend()
    select_choice(fake.generate_from_body, "Q? ", ["a", "b", "c"])
    first, second = fake.calls
    assert first == {"text": "Q? ", "sampling_params": {"max_new_tokens": 0}}
    assert second["text"] == ["Q? a", "Q? b", "Q? c"]
    assert second["logprob_start_len"] == 1 and second["return_text_in_logprobs"] is True
