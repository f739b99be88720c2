"""Sampling: the Triton kernel (on the GPU, or the interpreter on the CPU) against the torch
reference with the same uniforms, the reference against the sort-based kept distribution,
and the semantics by hand.

Tolerance: tokens must be equal. The two differ only in fp32 summation order, which moves a
token only when a uniform falls within ~1e-6 of a CDF boundary; the inputs here are seeded,
so the test is deterministic.
"""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels.sampling import (
    kept_probs_torch,
    sample_by_race_torch,
    sample_from_logits,
    sample_from_logits_torch,
)

# (temperature, top_k, top_p, min_p) per row: greedy, top_k == 1, plain, each filter, joint
ROWS = [
    (0.0, -1, 1.0, 0.0), (1.0, 1, 1.0, 0.0), (1.0, -1, 1.0, 0.0), (0.7, 5, 1.0, 0.0),
    (1.3, -1, 0.8, 0.0), (1.0, -1, 1.0, 0.2), (1.5, 40, 0.9, 0.05), (0.5, 3, 0.5, 0.1),
    (2.0, 100, 0.3, 0.0), (1.0, 1000, 0.99, 0.0),
]


def params(rows=ROWS):
    t, k, p, m = zip(*rows)
    return (torch.tensor(t), torch.tensor(k, dtype=torch.int32), torch.tensor(p),
            torch.tensor(m))


def make_logits(bs, vocab, seed, dtype=torch.float32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, vocab, generator=g) * scale
    logits[1::3, ::7] = float("-inf")  # grammar-masked tokens
    logits[2::3, 10:20] = logits[2::3, 10:11]  # ties
    return logits.to(dtype)


# scale 3: peaked rows, mostly accepted in round 0; scale 0.1: flat rows, many rejections
@pytest.mark.parametrize("dtype,scale", [(torch.float32, 3.0), (torch.bfloat16, 3.0),
                                         (torch.float32, 0.1)])
def test_kernel_matches_reference(dtype, scale, kernel_device):
    logits = make_logits(len(ROWS), 300, seed=0, dtype=dtype, scale=scale)  # 2 partial blocks
    uniforms = torch.rand(len(ROWS), 32, generator=torch.Generator().manual_seed(1))
    logits, uniforms = logits.to(kernel_device), uniforms.to(kernel_device)
    rows = [x.to(kernel_device) for x in params()]
    want = sample_from_logits(logits, *rows, uniforms, backend="torch")
    got = sample_from_logits(logits, *rows, uniforms, backend="triton")
    assert got.dtype == torch.int64
    assert got.tolist() == want.tolist()


def test_reference_draws_only_kept_tokens_with_the_kept_distribution():
    rows = ROWS[3:8]  # each filter alone and jointly; at scale 1, 10-55% rejected in round 0
    logits = make_logits(len(rows), 40, seed=2, scale=1.0)
    probs = kept_probs_torch(logits, *params(rows))  # [rows, 40]
    n = 4000
    big = logits.repeat_interleave(n, 0)
    reps = [x.repeat_interleave(n, 0) for x in params(rows)]
    uniforms = torch.rand(len(rows) * n, 32, generator=torch.Generator().manual_seed(3))
    tokens = sample_from_logits_torch(big, *reps, uniforms).view(len(rows), n)
    for r in range(len(rows)):
        assert (probs[r][tokens[r]] > 0).all()  # only kept tokens
        freq = torch.bincount(tokens[r], minlength=40).float() / n
        sigma = (probs[r] * (1 - probs[r]) / n).sqrt()
        assert ((freq - probs[r]).abs() <= 4.5 * sigma + 1e-3).all()  # every token within 4.5σ


def test_the_race_draws_the_same_kept_distribution():
    """The CPU's draw (exponential race over a sort-found kept set), ties and -inf included."""
    rows = ROWS
    logits = make_logits(len(rows), 40, seed=4, scale=1.0)
    probs = kept_probs_torch(logits, *params(rows))
    n = 4000
    big = logits.repeat_interleave(n, 0)
    reps = [x.repeat_interleave(n, 0) for x in params(rows)]
    noise = torch.empty(big.shape).exponential_(generator=torch.Generator().manual_seed(5))
    tokens = sample_by_race_torch(big, *reps, noise).view(len(rows), n)
    for r in range(len(rows)):
        assert (probs[r][tokens[r]] > 0).all()  # only kept tokens; greedy rows their argmax
        freq = torch.bincount(tokens[r], minlength=40).float() / n
        sigma = (probs[r] * (1 - probs[r]) / n).sqrt()
        assert ((freq - probs[r]).abs() <= 4.5 * sigma + 1e-3).all()


def test_the_race_keeps_its_token_when_the_logits_round_differently():
    """Why the CPU draws by race: a flat row's logits nudged by bf16-sized rounding keep almost
    every draw (CDF inversion moves by the sum of all earlier tokens' rounding)."""
    logits = torch.randn(2000, 512, generator=torch.Generator().manual_seed(6)) * 0.1
    nudged = logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(7)) * 1e-3
    one = torch.ones(2000)
    k, p, m = torch.full((2000,), -1, dtype=torch.int32), one, torch.zeros(2000)
    noise = torch.empty(logits.shape).exponential_(generator=torch.Generator().manual_seed(8))
    race = (sample_by_race_torch(logits, one, k, p, m, noise)
            == sample_by_race_torch(nudged, one, k, p, m, noise)).float().mean()
    uniforms = torch.rand(2000, 32, generator=torch.Generator().manual_seed(9))
    inversion = (sample_from_logits_torch(logits, one, k, p, m, uniforms)
                 == sample_from_logits_torch(nudged, one, k, p, m, uniforms)).float().mean()
    assert race > 0.99 and race > inversion, (race, inversion)


def test_kept_set_semantics_by_hand():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    one = torch.ones(1)

    def kept(top_k=-1, top_p=1.0, min_p=0.0):
        p = kept_probs_torch(logits, one, torch.tensor([top_k], dtype=torch.int32),
                             torch.tensor([top_p]), torch.tensor([min_p]))
        return (p[0] > 0).nonzero().flatten().tolist()

    assert kept() == [0, 1, 2, 3]
    assert kept(top_k=2) == [0, 1]
    assert kept(top_p=0.65) == [0, 1]  # mass above token 1: 0.4 < 0.65; above token 2: 0.7
    assert kept(top_p=0.75) == [0, 1, 2]
    assert kept(min_p=0.45) == [0, 1, 2]  # 0.2 >= 0.45 * 0.4
    assert kept(min_p=0.55) == [0, 1]
    assert kept(top_k=2, top_p=0.5) == [0, 1]  # joint: top-p mass is not renormalised (HF: [0])
    tied = torch.tensor([[3.0, 2.0, 2.0, 0.0]])
    def kept_tied(top_k):
        p = kept_probs_torch(tied, one, torch.tensor([top_k], dtype=torch.int32), one,
                             torch.zeros(1))
        return (p[0] > 0).nonzero().flatten().tolist()

    assert kept_tied(1) == [0]  # top_k 1 is greedy
    assert kept_tied(2) == [0, 1, 2]  # tokens tied at the k-th value all stay


def test_uniforms_from_generator_are_reproducible():
    logits = make_logits(4, 64, seed=4)
    ps = params(ROWS[2:6])
    a = sample_from_logits(logits, *ps, generator=torch.Generator().manual_seed(7))
    b = sample_from_logits(logits, *ps, generator=torch.Generator().manual_seed(7))
    assert a.tolist() == b.tolist()
    assert torch.equal(logits, make_logits(4, 64, seed=4))  # logits not modified


def test_bad_shapes_raise():
    logits = torch.zeros(2, 8)
    t, k, p, m = params(ROWS[:2])
    with pytest.raises(ValueError, match="top_ps"):
        sample_from_logits(logits, t, k, p[:1], m)
    with pytest.raises(ValueError, match="uniforms"):
        sample_from_logits(logits, t, k, p, m, torch.rand(3, 4))


def test_inputs_on_another_device_raise():
    logits = torch.zeros(2, 8, device="meta")
    on_cpu = params(ROWS[:2])
    t, k, p, m = (x.to("meta") for x in on_cpu)
    with pytest.raises(ValueError, match="uniforms is on cpu"):
        sample_from_logits(logits, t, k, p, m, torch.rand(2, 4))
    with pytest.raises(ValueError, match="generator is on cpu"):
        sample_from_logits(logits, t, k, p, m, generator=torch.Generator())
    with pytest.raises(ValueError, match="top_ks is on cpu"):
        sample_from_logits(logits, t, on_cpu[1], p, m)
