"""window_kv: in a model whose every layer is windowed, a long generation gives back the KV
behind the window while it runs; the output is unchanged, the slot invariant holds, and the
radix tree keeps the prompts (what follows the freed gap is not cached)."""

from __future__ import annotations

import pytest
from helpers.family_models import PROMPTS, make_family_model

from radixflow.runtime.engine import Engine
from radixflow.runtime.scheduler import decode, state, window_kv

PARAMS = {"max_new_tokens": 80, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    folder, _, tok = make_family_model(tmp_path_factory.mktemp("mistral"), "mistral")  # W 8
    return folder, [len(tok(p)["input_ids"]) for p in PROMPTS[:2]]


def _run(folder, monkeypatch, *, freeing: bool):
    gaps: list[int] = []

    def spy(st, reqs):
        window_kv.free_behind_windows(st, reqs)
        gaps.extend(b - a for a, b in (r.window_freed for r in reqs if r.window_freed))

    monkeypatch.setattr(decode, "free_behind_windows", spy)
    if not freeing:
        monkeypatch.setattr(state, "window_of", lambda model_args: None)
    with Engine(str(folder), dtype="float32", max_total_tokens=1024) as engine:
        st = engine.scheduler.state
        assert st.kv_window == (8 if freeing else None)
        outs = [r["output_ids"] for r in engine.generate(PROMPTS[:2], PARAMS)]
        engine.scheduler.check_slots()
        again = engine.generate(PROMPTS[0], {**PARAMS, "max_new_tokens": 1})
        engine.scheduler.check_slots()
        return outs, max(gaps, default=0), st.tree.total_size(), again["meta_info"]


def test_generations_free_behind_the_window_and_keep_their_prompts(mistral, monkeypatch):
    folder, prompt_lens = mistral
    outs, gap, tree_tokens, again = _run(folder, monkeypatch, freeing=True)
    with monkeypatch.context() as m:
        full_outs, no_gap, full_tree, _ = _run(folder, m, freeing=False)
    assert outs == full_outs  # the freed keys were never to be read again
    assert no_gap == 0 and gap >= 80 - 8 - window_kv.TAKE_BACK_SLACK - window_kv.FREE_AT_LEAST
    # the tree holds the prompts (and the last request's own tokens), not the long outputs
    assert tree_tokens < full_tree
    assert again["cached_tokens"] == prompt_lens[0] - 1  # the prompt was still cached


def test_a_small_pool_retracts_requests_with_gaps_and_loses_nothing(mistral, monkeypatch):
    """Three 80-token generations in a pool of 128 slots: freeing behind the window, they
    still outgrow it, so requests that hold a gap are retracted and recomputed from their
    cached prompts; the outputs are those of a pool that never retracts."""
    folder, _ = mistral
    with Engine(str(folder), dtype="float32", max_total_tokens=2048) as engine:
        expected = [r["output_ids"] for r in engine.generate(PROMPTS[:3], PARAMS)]
    gapped = []

    def spy(st, reqs):
        window_kv.free_behind_windows(st, reqs)
        gapped.extend(r.rid for r in reqs if r.window_freed)

    monkeypatch.setattr(decode, "free_behind_windows", spy)
    with Engine(str(folder), dtype="float32", max_total_tokens=128) as engine:
        outs = [r["output_ids"] for r in engine.generate(PROMPTS[:3], PARAMS)]
        engine.scheduler.check_slots()
        assert engine.scheduler.state.num_retractions > 0 and gapped
    assert outs == expected
