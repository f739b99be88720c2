"""The sampler the scheduler calls, on the CPU (its torch path; tests/kernels holds the Triton
kernel to the same tokens).

The one top-k/top-p semantic: top-k, top-p and min-p act jointly on the temperature-scaled
distribution, as in SGLang and FlashInfer; top-p's mass is not renormalised after top-k, unlike
Hugging Face's sequential warpers (pinned by test_top_k_and_top_p_act_jointly_not_sequentially;
stated exactly in radixflow.kernels.sampling).
"""

from __future__ import annotations

import pytest
import torch

from radixflow.runtime.sampling import SamplingBatch, compute_logprobs, sample, top_logprobs
from radixflow.runtime.sampling_params import SamplingParams

VOCAB = 24
EOS = 3


def make_batch(params, *, output_ids=None, prompt_ids=None, generators=None, vocab=VOCAB,
               device="cpu"):
    bs = len(params)
    return SamplingBatch.build(
        params,
        output_ids if output_ids is not None else [[] for _ in range(bs)],
        prompt_ids if prompt_ids is not None else [[] for _ in range(bs)],
        generators if generators is not None else [None] * bs,
        [EOS],
        vocab,
        device,
    )


def pack(allowed: torch.Tensor) -> torch.Tensor:
    """bool [bs, vocab] -> xgrammar's packed int32 bitmask [bs, ceil(vocab / 32)]."""
    bs, vocab = allowed.shape
    words = -(-vocab // 32)
    bits = torch.zeros(bs, words * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    packed = (bits.view(bs, words, 32) << torch.arange(32)).sum(-1)
    return (packed - (packed >= 2**31).long() * 2**32).to(torch.int32)  # two's complement


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def draws(logits_row: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    """n samples of one distribution, as one batch of n identical rows: [n] int64."""
    batch = make_batch([params] * n, vocab=logits_row.shape[-1])
    return sample(logits_row.expand(n, -1).clone(), batch).next_ids


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, VOCAB) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(top_k=1, temperature=2.0),
        SamplingParams(temperature=5.0, top_p=0.5),
        SamplingParams(temperature=0.0, seed=3),
        SamplingParams(temperature=1e-7),
    ]
    gens = [None, None, None, None, seeded(3), None]
    for _ in range(5):
        out = sample(logits, make_batch(params, generators=gens))
        greedy = [0, 2, 4, 5]
        assert out.next_ids[greedy].tolist() == logits.argmax(-1)[greedy].tolist()


def test_all_greedy_batch_equals_argmax_and_draws_no_random_numbers():
    logits = torch.randn(4, VOCAB, dtype=torch.bfloat16)
    state = torch.get_rng_state()
    out = sample(logits, make_batch([SamplingParams(temperature=0.0)] * 4))
    assert torch.equal(torch.get_rng_state(), state)
    assert out.next_ids.dtype == torch.int64
    assert out.next_ids.tolist() == logits.float().argmax(-1).tolist()


def test_batch_without_penalties_builds_no_penalty_tensors():
    batch = make_batch([SamplingParams(), SamplingParams(temperature=0.0)])
    assert not batch.needs_penalties and batch.penalties is None
    batch = make_batch([SamplingParams(), SamplingParams(presence_penalty=0.5)])
    assert batch.needs_penalties


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB) * 2
    prompts, outputs = [[1, 5, 5, 9], [2, 7], [4]], [[9, 11], [], [4, 20, 21]]
    penalties = [1.3, 0.7, 1.0]
    batch = make_batch(
        [SamplingParams(repetition_penalty=p) for p in penalties],
        output_ids=outputs,
        prompt_ids=prompts,
    )
    got = batch.penalties.apply(logits)
    for i, p in enumerate(penalties):
        ids = torch.tensor([prompts[i] + outputs[i]])
        want = RepetitionPenaltyLogitsProcessor(p)(ids, logits[i : i + 1].clone())
        torch.testing.assert_close(got[i], want[0])
    assert not torch.equal(got[0], logits[0])


def test_frequency_and_presence_penalties_match_a_direct_computation():
    torch.manual_seed(2)
    logits = torch.randn(3, VOCAB)
    prompts, outputs = [[6, 6, 6], [1], [2, 3]], [[6, 8, 8, 8, 10], [1, 1], []]
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
        SamplingParams(frequency_penalty=-1.0),
        SamplingParams(presence_penalty=2.0),
    ]
    got = make_batch(params, output_ids=outputs, prompt_ids=prompts).penalties.apply(logits)
    want = logits.clone()
    for i, p in enumerate(params):
        for token in set(outputs[i]):  # the prompt does not count
            count = outputs[i].count(token)
            want[i, token] -= p.frequency_penalty * count + p.presence_penalty
    torch.testing.assert_close(got, want)


def test_penalties_change_the_greedy_choice():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 2.0, 1.5
    plain = make_batch([SamplingParams(temperature=0.0)], output_ids=[[5]])
    assert sample(logits, plain).next_ids.item() == 5
    for params in (
        SamplingParams(temperature=0.0, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, frequency_penalty=1.0),
        SamplingParams(temperature=0.0, presence_penalty=1.0),
    ):
        batch = make_batch([params], output_ids=[[5]], prompt_ids=[[1]])
        assert sample(logits, batch).next_ids.item() == 6


def test_filters_never_sample_a_filtered_token_and_keep_the_rest():
    from transformers import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(3)
    logits = torch.randn(VOCAB) * 1.5
    cases = [
        (SamplingParams(top_k=5), [TopKLogitsWarper(5)]),
        (SamplingParams(top_p=0.6), [TopPLogitsWarper(0.6)]),
        (SamplingParams(min_p=0.2), [MinPLogitsWarper(0.2)]),
        # top-p first: HF's sequential order then gives the joint kept set
        (
            SamplingParams(top_k=8, top_p=0.7, min_p=0.1, temperature=0.8),
            [TopPLogitsWarper(0.7), TopKLogitsWarper(8), MinPLogitsWarper(0.1)],
        ),
    ]
    for params, warpers in cases:
        scores = logits[None] / params.temperature
        for warper in warpers:
            scores = warper(torch.zeros(1, 1, dtype=torch.long), scores)
        allowed = set(torch.isfinite(scores[0]).nonzero().flatten().tolist())
        assert 1 < len(allowed) < VOCAB
        drawn = set(draws(logits, params, 4000).tolist())
        assert drawn == allowed, params


def test_top_k_and_top_p_act_jointly_not_sequentially():
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    # probs [.4, .3, .2, .1], top_k 2, top_p 0.5. Jointly: the mass above token 1 is 0.4 < 0.5,
    # so {0, 1}. Sequentially (HF): top-k renormalises to [.57, .43], and .57 >= 0.5 keeps {0}.
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    ids = draws(logits, SamplingParams(top_k=2, top_p=0.5), 2000)
    assert set(ids.tolist()) == {0, 1}
    no_ids = torch.zeros(1, 1, dtype=torch.long)
    sequential = TopPLogitsWarper(0.5)(no_ids, TopKLogitsWarper(2)(no_ids, logits[None]))
    assert torch.isfinite(sequential[0]).nonzero().flatten().tolist() == [0]


def test_filters_apply_per_row():
    torch.manual_seed(4)
    logits = torch.randn(VOCAB).expand(3000, -1).clone()
    params = [SamplingParams(top_k=2), SamplingParams(), SamplingParams(min_p=0.9)] * 1000
    ids = sample(logits, make_batch(params)).next_ids.view(1000, 3)
    order = logits[0].argsort(descending=True)
    assert set(ids[:, 0].tolist()) == set(order[:2].tolist())
    assert len(set(ids[:, 1].tolist())) > 10
    assert set(ids[:, 2].tolist()) <= set(order[:2].tolist())


def test_temperature_sampling_follows_softmax():
    torch.manual_seed(5)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    n, temperature = 20000, 0.7
    ids = draws(logits, SamplingParams(temperature=temperature), n)
    observed = torch.bincount(ids, minlength=8).double()
    expected = torch.softmax(logits.double() / temperature, -1) * n
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2 < 30.0  # 7 degrees of freedom: p < 1e-4 above ~29.9
    hot = torch.bincount(draws(logits, SamplingParams(temperature=5.0), n), minlength=8)
    assert hot.min() > observed.min()  # higher temperature flattens the distribution


def _seeded_tokens(position: int, others: list[SamplingParams], steps: int, seed: int):
    torch.manual_seed(1000 + position)  # the global RNG differs between compositions
    target = SamplingParams(temperature=1.3, top_p=0.9, seed=seed)
    params = others[:position] + [target] + others[position:]
    gens = [None] * len(params)
    gen = seeded(seed)
    gens[position] = gen
    other_seeded = [i for i, p in enumerate(params) if p.seed is not None and i != position]
    for i in other_seeded:
        gens[i] = seeded(params[i].seed)
    rows = torch.randn(len(params), VOCAB)
    logits_row = torch.linspace(-2.0, 2.0, VOCAB)
    tokens = []
    for _ in range(steps):
        rows[position] = logits_row
        out = sample(rows, make_batch(params, generators=gens))
        tokens.append(out.next_ids[position].item())
    return tokens


def test_same_seed_gives_same_tokens_in_any_batch_composition():
    alone = _seeded_tokens(0, [], steps=12, seed=42)
    mixed = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(seed=7, top_k=4)]
    assert _seeded_tokens(2, mixed, steps=12, seed=42) == alone
    assert _seeded_tokens(1, mixed * 3, steps=12, seed=42) == alone
    assert _seeded_tokens(0, mixed, steps=12, seed=43) != alone


def test_min_new_tokens_blocks_eos_and_stop_token_ids():
    logits = torch.zeros(2, VOCAB)
    logits[:, EOS] = 10.0
    logits[:, 7] = 9.0
    logits[:, 12] = 8.0
    params = SamplingParams(temperature=0.0, min_new_tokens=3, stop_token_ids=[7])
    early = make_batch([params, params], output_ids=[[1], [1, 2]])
    assert sample(logits, early).next_ids.tolist() == [12, 12]
    done = make_batch([params, params], output_ids=[[1, 2, 3], [1, 2, 3, 4]])
    assert sample(logits, done).next_ids.tolist() == [EOS, EOS]
    # ignore_eos rows may emit EOS (it does not end them); stop ids stay banned.
    keep = SamplingParams(temperature=0.0, min_new_tokens=3, stop_token_ids=[7], ignore_eos=True)
    assert sample(logits[:1], make_batch([keep], output_ids=[[]])).next_ids.item() == EOS
    hot = SamplingParams(temperature=3.0, min_new_tokens=5, stop_token_ids=[7])
    ids = draws(logits[0], hot, 2000)
    assert EOS not in ids.tolist() and 7 not in ids.tolist()


def test_logprobs_are_of_the_raw_logits():
    torch.manual_seed(6)
    logits = (torch.randn(4, VOCAB) * 2).to(torch.bfloat16)
    params = [
        SamplingParams(temperature=0.5, repetition_penalty=1.4),
        SamplingParams(temperature=0.0, frequency_penalty=1.5),
        SamplingParams(top_k=3, temperature=2.0),
        SamplingParams(min_p=0.3, min_new_tokens=4),
    ]
    batch = make_batch(params, output_ids=[[1, 2], [3, 3], [], []], prompt_ids=[[4], [], [], []])
    mask = torch.rand(4, VOCAB) > 0.3
    mask[:, 0] = True
    out = sample(logits, batch, top_logprobs_num=5, bitmask=pack(mask))
    reference = torch.log_softmax(logits.float(), dim=-1)
    assert out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs, reference.gather(1, out.next_ids[:, None])[:, 0])
    values, ids = out.top_logprobs
    want_values = reference.topk(5, dim=-1).values
    torch.testing.assert_close(values, want_values)
    torch.testing.assert_close(reference.gather(1, ids), want_values)
    assert mask.gather(1, out.next_ids[:, None]).all()
    assert sample(logits, batch).top_logprobs is None


def test_logprob_helpers():
    torch.manual_seed(7)
    logits = torch.randn(5, VOCAB, dtype=torch.float16)
    reference = torch.log_softmax(logits.float(), dim=-1)
    token_ids = torch.tensor([0, 3, 23, 5, 5])
    torch.testing.assert_close(compute_logprobs(logits, token_ids), reference[range(5), token_ids])
    for rows in (logits, reference):  # raw logits or log-probs give the same answer
        values, ids = top_logprobs(rows, 4)
        torch.testing.assert_close(values, reference.topk(4, dim=-1).values)
        torch.testing.assert_close(reference.gather(1, ids), values)
    assert top_logprobs(logits, 100)[0].shape == (5, VOCAB)


def test_bitmask_restricts_sampling_to_its_rows():
    torch.manual_seed(8)
    logits = torch.randn(VOCAB).expand(500, -1).clone()
    allowed = torch.zeros(VOCAB, dtype=torch.bool)
    allowed[[2, 9, 17]] = True
    params = [SamplingParams(temperature=2.0)] * 499 + [SamplingParams(temperature=0.0)]
    out = sample(logits.clone(), make_batch(params), bitmask=pack(allowed.expand(500, -1)))
    assert set(out.next_ids.tolist()) == {2, 9, 17}
    rows = list(range(0, 500, 2))
    out = sample(logits.clone(), make_batch(params), bitmask=pack(allowed.expand(500, -1)),
                 mask_rows=rows)
    assert set(out.next_ids[rows].tolist()) == {2, 9, 17}
    assert len(set(out.next_ids[1::2].tolist())) > 3  # rows without a grammar: unmasked


def test_logits_stay_raw_when_logprobs_are_asked_for():
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    allowed = torch.zeros(2, VOCAB, dtype=torch.bool)
    allowed[:, 5] = True
    batch = make_batch([SamplingParams(temperature=0.0)] * 2)
    out = sample(logits, batch, bitmask=pack(allowed), need_logprobs=True)
    assert out.next_ids.tolist() == [5, 5]
    assert torch.equal(logits, before)


def test_a_generator_on_another_device_is_rejected():
    params = [SamplingParams(seed=1, temperature=1.0)]
    with pytest.raises(ValueError, match="generator is on cpu"):
        make_batch(params, generators=[seeded(1)], device="meta")


def test_mismatched_logits_shape_is_rejected():
    batch = make_batch([SamplingParams()])
    with pytest.raises(ValueError, match="do not match"):
        sample(torch.zeros(2, VOCAB), batch)


def test_a_batch_without_logit_bias_builds_no_bias_tensors():
    batch = make_batch([SamplingParams(), SamplingParams(logit_bias={})])
    assert batch.bias_rows is None and batch.bias_ids is None and batch.bias_values is None


def test_logit_bias_moves_the_greedy_choice_of_its_row_only():
    torch.manual_seed(9)
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    plain = logits.argmax(dim=-1)
    low = int(logits[1].argmin())
    params = [SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0, logit_bias={low: 100.0}),
              SamplingParams(temperature=0.0, logit_bias={int(plain[2]): -100.0})]
    out = sample(logits, make_batch(params), need_logprobs=True)
    assert out.next_ids[0] == plain[0] and out.next_ids[1] == low
    assert out.next_ids[2] != plain[2]
    assert out.next_ids[2] == logits[2].topk(2).indices[1]  # the runner-up
    assert torch.equal(logits, before)  # logprobs stay those of the raw logits
    torch.testing.assert_close(out.logprobs, compute_logprobs(before, out.next_ids))


def test_a_bias_of_minus_100_bans_even_a_dominant_token():
    logits = torch.zeros(1, VOCAB)
    logits[0, 4] = 1e4  # far more than any finite bias could undo
    ban = SamplingParams(temperature=0.0, logit_bias={4: -100.0})
    assert sample(logits.clone(), make_batch([ban])).next_ids.item() != 4
    hot = SamplingParams(temperature=5.0, logit_bias={4: -100.0, 9: -100.0})
    assert not {4, 9} & set(draws(logits[0], hot, 2000).tolist())


def test_a_bias_of_plus_100_forces_a_token_when_sampling():
    torch.manual_seed(10)
    logits = torch.randn(VOCAB) * 3
    forced = int(logits.argmin())
    params = SamplingParams(temperature=1.5, top_p=0.9, logit_bias={forced: 100.0})
    assert set(draws(logits, params, 500).tolist()) == {forced}


def test_logit_bias_cannot_lift_a_grammar_mask_or_a_min_new_tokens_ban():
    logits = torch.zeros(2, VOCAB)
    logits[:, 6] = 1.0
    allowed = torch.zeros(2, VOCAB, dtype=torch.bool)
    allowed[:, [6, 8]] = True
    params = SamplingParams(temperature=0.0, logit_bias={11: 100.0, 8: 50.0})
    out = sample(logits.clone(), make_batch([params] * 2), bitmask=pack(allowed))
    assert out.next_ids.tolist() == [8, 8]
    early = SamplingParams(temperature=0.0, min_new_tokens=2, logit_bias={EOS: 100.0})
    assert sample(logits[:1].clone(), make_batch([early], output_ids=[[1]])).next_ids.item() == 6
    done = make_batch([early], output_ids=[[1, 2]])
    assert sample(logits[:1].clone(), done).next_ids.item() == EOS


def test_logit_bias_adds_to_the_penalised_logits():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 7] = 2.0, 1.1
    # A repetition penalty of 2 halves token 5's logit to 1.0; the bias is added afterwards
    # (as in SGLang): 1.0 + 0.15 beats 1.1, where (2.0 + 0.15) / 2 would not.
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, logit_bias={5: 0.15})
    out = sample(logits.clone(), make_batch([params], output_ids=[[5]]))
    assert out.next_ids.item() == 5


def test_logit_bias_past_the_vocabulary_is_dropped_not_indexed():
    batch = make_batch([SamplingParams(temperature=0.0, logit_bias={3: 1.0, VOCAB + 5: 1.0})])
    assert batch.bias_ids.tolist() == [3]
