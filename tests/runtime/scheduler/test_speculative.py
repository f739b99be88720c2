"""Speculative decoding (runtime/scheduler/speculate.py): greedy outputs token for token as
without it, sampled outputs with the same distribution, rejected drafts' KV slots back in the
pool, the radix tree holding committed tokens only, at the torch path and the C decode step."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from helpers.engine_checks import settle
from helpers.spec_oracle import Oracle, every_draft_runs

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.request_building import tokenize_prompt
from radixflow.runtime.scheduler import speculate
from radixflow.runtime.server_args import ServerArgs
from radixflow.runtime.speculative.ngram import NgramDrafter

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 6},
                         "pet": {"enum": ["cat", "dog", "parrot"]}},
          "required": ["name", "pet"], "additionalProperties": False}
PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "a b c a b c a b",
           "Numbers: 1 2 3 1 2 3 1 2", "Please answer in JSON:", "Hello"]
GREEDY = {"temperature": 0}


@pytest.fixture(autouse=True)
def _every_draft_runs(monkeypatch):
    every_draft_runs(monkeypatch)  # (the cost gate: test_speculation_cost.py)


def _params() -> list[dict]:
    """Requests that end for different reasons, mid-draft included."""
    return [
        {"max_new_tokens": 40, "ignore_eos": True, **GREEDY},
        {"max_new_tokens": 3, "ignore_eos": True, **GREEDY},
        {"max_new_tokens": 30, "json_schema": json.dumps(SCHEMA), **GREEDY},  # jumps
        {"max_new_tokens": 30, "regex": r"(yes|no)( [a-z]{1,4}){1,5}\.", **GREEDY},
        {"max_new_tokens": 24, "stop": [" the", "e"], **GREEDY},
        {"max_new_tokens": 24, "stop_token_ids": [5, 6, 7, 8, 9, 10, 11, 12], **GREEDY},
        {"max_new_tokens": 16, "min_new_tokens": 4, "repetition_penalty": 1.3, **GREEDY},
    ]


def _batch() -> tuple[list[str], list[dict]]:
    params = _params()
    return [PROMPTS[i % len(PROMPTS)] for i in range(len(params))], params


def _strip(out: dict) -> dict:
    meta = out["meta_info"]
    return {"ids": out["output_ids"], "finish": meta["finish_reason"], "text": out["text"]}


def _tree_sequences(tree) -> list[list[int]]:
    """Every root-to-leaf token sequence the radix tree holds."""
    seqs, stack = [], [(tree.root, [])]
    while stack:
        node, prefix = stack.pop()
        here = prefix + list(node.key)
        if not node.children:
            seqs.append(here)
        stack += [(child, here) for child in node.children.values()]
    return seqs


def _only_committed(engine, prompts: list[str], outs: list[dict]) -> None:
    """The tree's sequences are each a prefix of some request's prompt + output."""
    tok = engine.tokenizer
    full = [tokenize_prompt(tok, p) + o["output_ids"] for p, o in zip(prompts, outs)]
    for seq in _tree_sequences(engine.scheduler.state.tree):
        assert any(f[:len(seq)] == seq for f in full), "the tree holds an uncommitted token"


@pytest.fixture(scope="module")
def engines(tiny_llama):
    args = dict(dtype="float32", max_total_tokens=3000, max_running_requests=16)
    # (a random model rarely repeats a bigram: unigram matches make it draft)
    with Engine(str(tiny_llama), speculative_algorithm="ngram",
                speculative_num_draft_tokens=5, speculative_ngram_min_match_window_size=1,
                **args) as on, \
            Engine(str(tiny_llama), **args) as off:
        yield on, off


def test_greedy_outputs_are_token_identical(engines):
    on, off = engines
    prompts, params = _batch()
    want = [_strip(o) for o in off.generate(prompts, params)]
    before = dict(on.scheduler.state.stats)
    outs = on.generate(prompts, params)
    assert [_strip(o) for o in outs] == want
    stats = on.scheduler.state.stats
    assert stats["spec_verify_passes"] > before["spec_verify_passes"]  # it did speculate
    settle(on)
    _only_committed(on, prompts, outs)
    metas = [o["meta_info"] for o in outs]
    assert any(m.get("spec_verify_ct", 0) > 0 for m in metas)
    for m in metas:
        if "spec_verify_ct" in m:
            assert 0 <= m["spec_accept_token_num"] <= m["spec_draft_token_num"]


@pytest.mark.parametrize("wrong_at", [None, 0, 2])
def test_oracle_drafts_are_accepted_up_to_the_first_wrong_token(engines, monkeypatch,
                                                                wrong_at):
    on, off = engines
    prompts, params = _batch()
    want = off.generate(prompts, params)
    tok = on.tokenizer
    monkeypatch.setattr(Oracle, "futures",
                        [tokenize_prompt(tok, p) + w["output_ids"] for p, w in zip(prompts, want)])
    monkeypatch.setattr(Oracle, "wrong_at", wrong_at)
    monkeypatch.setattr(speculate, "NgramDrafter", Oracle)
    passes = on.scheduler.num_forward_passes
    outs = on.generate(prompts, params)
    assert [_strip(o) for o in outs] == [_strip(w) for w in want]
    metas = [o["meta_info"] for o in outs]
    drafted = sum(m.get("spec_draft_token_num", 0) for m in metas)
    accepted = sum(m.get("spec_accept_token_num", 0) for m in metas)
    assert drafted > 0
    if wrong_at is None:  # every draft right: all accepted, far fewer passes
        # (a constrained output's jumps and closings append tokens unsampled: a draft over
        # them may be drawn otherwise, with the same output)
        free = [m for m, p in zip(metas, params) if "json_schema" not in p and "regex" not in p]
        assert all(m["spec_accept_token_num"] == m["spec_draft_token_num"] for m in free)
        longest = max(len(o["output_ids"]) for o in outs)
        assert on.scheduler.num_forward_passes - passes < longest / 2
    elif wrong_at == 0:
        assert accepted == 0
    else:
        assert 0 < accepted < drafted
    settle(on)
    _only_committed(on, prompts, outs)


def test_sampled_outputs_keep_their_distribution(engines, monkeypatch):
    """A drafted token is accepted iff the draw equals it, the rest drawn from the same
    distribution: the second token's frequencies match decoding without speculation."""
    on, off = engines
    n = 400
    params = [{"max_new_tokens": 3, "temperature": 1.0, "top_k": 3, "seed": s,
               "ignore_eos": True}
              for s in range(n)]
    prompts = ["Once upon a time"] * n
    base = off.generate(prompts, params)
    first = Counter(o["output_ids"][0] for o in base).most_common(1)[0][0]
    second = Counter(o["output_ids"][1] for o in base if o["output_ids"][0] == first)
    likely = second.most_common(1)[0][0]  # draft the most likely second token
    tok = on.tokenizer
    monkeypatch.setattr(Oracle, "futures",
                        [tokenize_prompt(tok, prompts[0]) + [first, likely]])
    monkeypatch.setattr(Oracle, "wrong_at", None)
    monkeypatch.setattr(speculate, "NgramDrafter", Oracle)
    params = [{**p, "seed": p["seed"] + 10_000} for p in params]  # fresh draws
    outs = on.generate(prompts, params)
    spec = Counter(o["output_ids"][1] for o in outs if o["output_ids"][0] == first)
    assert sum(o["meta_info"].get("spec_verify_ct", 0) for o in outs) > 0
    total_b, total_s = sum(second.values()), sum(spec.values())
    assert total_b > 60 and total_s > 60
    tv = 0.5 * sum(abs(second[t] / total_b - spec[t] / total_s)
                   for t in set(second) | set(spec))
    assert tv < 0.2, (second.most_common(5), spec.most_common(5))


def test_a_request_turns_it_off_and_prediction_turns_it_on(engines):
    on, off = engines
    prompt, params = PROMPTS[1], {"max_new_tokens": 20, **GREEDY, "ignore_eos": True}
    out = on.generate(prompt, params, speculative=False)
    assert "spec_verify_ct" not in out["meta_info"]
    want = off.generate(prompt, params)
    predicted = off.generate(prompt, params, prediction=want["text"])
    assert predicted["output_ids"] == want["output_ids"]
    assert predicted["meta_info"]["spec_verify_ct"] > 0
    assert off.generate(prompt, params, speculative=True)["output_ids"] == want["output_ids"]
    with pytest.raises(InvalidRequest, match="speculative must be true or false"):
        on.generate(prompt, params, speculative="yes")
    with pytest.raises(InvalidRequest, match="prediction's content"):
        on.generate_from_body({"text": prompt, "prediction": {"type": "content",
                                                              "content": 5}})
    settle(on)
    settle(off)


def test_a_prediction_drafts_past_the_ngram_draft_length(engines, monkeypatch):
    """A prediction's drafts grow to --speculative-prediction-draft-tokens (16); the n-grams'
    stay within --speculative-num-draft-tokens (the `on` engine's 5)."""
    on, off = engines
    prompts, params = PROMPTS[:2], [{"max_new_tokens": 40, **GREEDY, "ignore_eos": True}] * 2
    want = off.generate(prompts, params)
    spec = on.scheduler.speculate
    drafted, propose = [], spec.propose

    def recording(reqs):
        drafts = propose(reqs)
        drafted.extend((bool(r.prediction_ids), len(d.tokens)) for r, d in drafts.items())
        return drafts

    monkeypatch.setattr(spec, "propose", recording)
    predicted = [on.generate(prompts[0], params[0], prediction=want[0]["text"]),
                 on.generate(prompts[1], params[1])]
    assert [o["output_ids"] for o in predicted] == [w["output_ids"] for w in want]
    longest = {p: max((n for q, n in drafted if q == p), default=0) for p in (True, False)}
    assert longest[True] == 16  # (its first draft: the prediction's start)
    assert 0 < longest[False] <= 5
    settle(on)


def test_prediction_draft_length_is_a_start_up_flag():
    with pytest.raises(ValueError, match="--speculative-prediction-draft-tokens"):
        ServerArgs(speculative_prediction_draft_tokens=17)


def test_a_wrong_prediction_changes_nothing(engines):
    on, off = engines
    prompt, params = PROMPTS[0], {"max_new_tokens": 24, **GREEDY, "ignore_eos": True}
    want = off.generate(prompt, params)["output_ids"]
    got = off.generate(prompt, params, prediction="completely unrelated words " * 8)
    assert got["output_ids"] == want
    settle(off)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
def test_the_c_decode_step_verifies_token_identically(tiny_llama, cpu_level, monkeypatch,
                                                      kv_cache_dtype):
    """At each CPU level, over a bf16 and an int8 KV cache: a request's verify rows get exact
    16-bit products and attend alone (never as a shared prefix of each other), as the request
    decoding alone does (an int8 cache: each drafted token's K/V quantized as a step would)."""
    common = dict(quantization="int4", max_total_tokens=2048, cpu_isa=cpu_level,
                  dtype="float32", kv_cache_dtype=kv_cache_dtype, max_running_requests=16)
    prompts, params = _batch()
    # alone, and over a prefix long enough to be attended as a shared one (>= 64 slots)
    prompts += [PROMPTS[0] * 8] * 2
    params += [{"max_new_tokens": 24, "ignore_eos": True, **GREEDY}] * 2
    with Engine(str(tiny_llama), **common) as eng:
        assert eng.scheduler.runner.cpu_decode is not None
        assert eng.flush_cache()  # (each run computes the whole prompt: the same K/V)
        alone = eng.generate(prompts[-1], params[-1], return_logprob=True)
        want = [_strip(o) for o in eng.generate(prompts, params)]
        tok = eng.tokenizer
        monkeypatch.setattr(Oracle, "futures", [tokenize_prompt(tok, p) + w["ids"]
                                                for p, w in zip(prompts, want)])
        monkeypatch.setattr(Oracle, "wrong_at", 3)
        monkeypatch.setattr(speculate, "NgramDrafter", Oracle)
        calls = eng.scheduler.runner.cpu_decode.calls
        assert eng.flush_cache()
        got = eng.generate(prompts[-1], params[-1], speculative=True, return_logprob=True)
        assert got["meta_info"]["spec_accept_token_num"] > 0
        # bit for bit: the logits of a verify row are those of the request decoding alone
        assert got["meta_info"]["output_token_logprobs"] == \
            alone["meta_info"]["output_token_logprobs"]
        outs = eng.generate(prompts, params, speculative=True)
        assert [_strip(o) for o in outs] == want
        assert eng.scheduler.runner.cpu_decode.calls > calls
        assert sum(o["meta_info"]["spec_accept_token_num"] for o in outs) > 0
        settle(eng)
        _only_committed(eng, prompts, outs)


def test_a_full_pool_drafts_nothing_and_retracts_nobody(tiny_llama):
    """Drafts take only free slots: a pool that just fits the requests still serves them."""
    with Engine(str(tiny_llama), dtype="float32", max_total_tokens=160,
                speculative_algorithm="ngram", max_running_requests=4) as eng:
        outs = eng.generate([PROMPTS[1]] * 4,
                            {"max_new_tokens": 24, "ignore_eos": True, **GREEDY})
        assert all(len(o["output_ids"]) == 24 for o in outs)
        settle(eng)


def test_overlap_scheduling_steps_aside_for_speculating_requests(tiny_llama):
    args = dict(dtype="float32", max_total_tokens=3000, max_running_requests=16)
    prompts, params = _batch()
    with Engine(str(tiny_llama), **args) as off:
        want = [_strip(o) for o in off.generate(prompts, params)]
    with Engine(str(tiny_llama), enable_overlap_schedule=True, speculative_algorithm="ngram",
                **args) as eng:
        assert eng.scheduler.overlap
        # half the batch speculates, half does not: both kinds finish as they would alone
        flags = [i % 2 == 0 for i in range(len(prompts))]
        outs = [eng.generate(p, q, speculative=f) for p, q, f in zip(prompts, params, flags)]
        assert [_strip(o) for o in outs] == want
        settle(eng)


@pytest.mark.parametrize("flags, message", [
    ({"speculative_algorithm": "eagle"}, "--speculative-algorithm 'eagle'"),
    ({"speculative_algorithm": "ngram", "speculative_num_draft_tokens": 0},
     "--speculative-num-draft-tokens"),
    ({"speculative_ngram_min_match_window_size": 4,
      "speculative_ngram_max_match_window_size": 2}, "match-window-size"),
])
def test_bad_flags_are_start_up_errors(flags, message):
    with pytest.raises(ValueError, match=message):
        ServerArgs(**flags)


# ---- the drafter ----

def test_the_longest_latest_match_drafts():
    d = NgramDrafter(1, 3)
    seq = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 2, 3]
    # [2, 3] occurs twice before the end: the latest one (followed by 4, 5) wins
    assert d.draft(seq, 2) == ([4, 5], False)
    assert d.draft(seq + [4], 3) == ([5, 2, 3], False)  # the trigram [2, 3, 4]
    assert NgramDrafter(2, 3).draft([1, 2, 3, 4], 2) == ([], False)  # no match
    assert d.draft(seq, 0) == ([], False)


def test_a_sequence_cut_back_is_indexed_anew():
    d = NgramDrafter(1, 2)
    assert d.draft([5, 6, 7, 5], 2) == ([6, 7], False)
    assert d.draft([8, 9], 1) == ([], False)  # shorter than what was indexed
    assert d.draft([8, 9, 8], 1) == ([9], False)


def test_the_prediction_is_followed_then_searched():
    prompt = [100, 101]
    d = NgramDrafter(2, 3, prediction=[1, 2, 3, 4, 5, 6], num_output_start=len(prompt))
    assert d.draft(prompt, 3) == ([1, 2, 3], True)  # nothing generated: its start
    assert d.draft(prompt + [1, 2], 2) == ([3, 4], True)  # still on it
    # off it (7 instead of 3), then back on a bigram of it: its continuation
    assert d.draft(prompt + [1, 2, 7], 2) == ([], False)
    assert d.draft(prompt + [1, 2, 7, 4, 5], 2) == ([6], True)
    with pytest.raises(ValueError, match="n-gram sizes"):
        NgramDrafter(3, 2)


def test_a_grammar_that_cannot_jump_drafts_what_it_forces(engines):
    """A constrained request reporting logprobs never jumps forward: the tokens its grammar
    forces are drafted instead, verified (and scored) in the pass."""
    on, off = engines
    params = {"max_new_tokens": 30, "json_schema": json.dumps(SCHEMA), **GREEDY}
    want = off.generate(PROMPTS[3], params, return_logprob=True)
    got = on.generate(PROMPTS[3], params, return_logprob=True)
    assert got["output_ids"] == want["output_ids"]
    meta = got["meta_info"]
    assert meta["spec_accept_token_num"] > 0
    assert len(meta["output_token_logprobs"]) == len(got["output_ids"])
    settle(on)


def _drafting_right(engines, prompts, params, monkeypatch) -> list[dict]:
    """The `on` engine drafts with an Oracle that knows the greedy outputs (returned, from the
    `off` engine): every draft right."""
    on, off = engines
    want = off.generate(prompts, params)
    tok = on.tokenizer
    monkeypatch.setattr(Oracle, "futures", [tokenize_prompt(tok, p) + w["output_ids"]
                                            for p, w in zip(prompts, want)])
    monkeypatch.setattr(Oracle, "wrong_at", None)
    monkeypatch.setattr(speculate, "NgramDrafter", Oracle)
    return want


def test_drafts_stay_within_a_pass_the_c_step_takes(engines, monkeypatch):
    """No pass gets more rows than the C decode step takes in one call (here: a limit of 6),
    the requests that accepted most recently drafting first."""
    on = engines[0]
    prompts, params = _batch()
    want = _drafting_right(engines, prompts, params, monkeypatch)
    spec = on.scheduler.speculate
    monkeypatch.setattr(spec, "max_rows", 6)
    passes, propose = [], spec.propose

    def recording(reqs):
        drafts = propose(reqs)
        real = sum(r.seq_len - r.computed_len for r in reqs)
        passes.append((real, sum(len(d.tokens) for d in drafts.values())))
        return drafts

    monkeypatch.setattr(spec, "propose", recording)
    outs = on.generate(prompts, params)
    assert [_strip(o) for o in outs] == [_strip(w) for w in want]
    assert sum(drafted for _, drafted in passes) > 0
    assert all(drafted == 0 or real + drafted <= 6 for real, drafted in passes), passes
    settle(on)


def test_requests_take_turns_when_a_pass_has_rows_for_one_draft(engines, monkeypatch):
    """Four requests whose drafts are all right and a pass with rows for one draft: each gets
    the rows in turn, not the first one step after step."""
    on = engines[0]
    prompts = PROMPTS[:4]
    params = [{"max_new_tokens": 24, "ignore_eos": True, **GREEDY}] * 4
    want = _drafting_right(engines, prompts, params, monkeypatch)
    spec = on.scheduler.speculate
    monkeypatch.setattr(spec, "max_rows", 8)  # 4 plain rows + one draft of 4
    drafting, propose = [], spec.propose

    def recording(reqs):
        drafts = propose(reqs)
        if len(reqs) == 4 and drafts:
            drafting.append({id(r) for r in drafts})
        return drafts

    monkeypatch.setattr(spec, "propose", recording)
    outs = on.generate(prompts, params)
    assert [o["output_ids"] for o in outs] == [w["output_ids"] for w in want]
    assert len(drafting) >= 4
    assert len(set().union(*drafting[:4])) == 4, "the same request drafted again"
    settle(on)
