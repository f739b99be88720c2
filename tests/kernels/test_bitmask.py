"""Grammar bitmask apply: Triton kernel (on the GPU, or the interpreter on the CPU), the
xgrammar-backed CPU path and the torch reference agree exactly (a mask either writes -inf or
leaves the logit bit-for-bit alone)."""

from __future__ import annotations

import pytest
import torch

from radixflow.kernels.bitmask import apply_bitmask_, apply_bitmask_torch_


def random_case(bs, vocab, words, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, vocab, generator=g).to(dtype)
    bitmask = torch.randint(-2**31, 2**31 - 1, (bs, words), dtype=torch.int32, generator=g)
    return logits.to(device), bitmask.to(device)


def test_reference_follows_the_bit_layout():
    logits = torch.zeros(2, 70)
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[0, 0] = 1 | (1 << 5)  # tokens 0 and 5
    bitmask[0, 1] = -2**31  # bit 31 of word 1: token 63
    bitmask[0, 2] = 1 << 5  # token 69
    apply_bitmask_torch_(logits, bitmask, [0])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 5, 63, 69]
    assert torch.isfinite(logits[1]).all()  # not listed: untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [None, [0, 3, 4], "tensor", []])
@pytest.mark.parametrize("words", [10, 8])  # 8 * 32 = 256 < vocab 300: padded vocab
def test_backends_agree(dtype, rows, words, kernel_device):
    logits, bitmask = random_case(6, 300, words, dtype, device=kernel_device)
    if rows == "tensor":
        rows = torch.tensor([5, 1])
    want = logits.clone()
    apply_bitmask_torch_(want, bitmask, rows)
    for backend in ("torch", "triton"):
        got = logits.clone()
        apply_bitmask_(got, bitmask, rows, backend=backend)
        assert torch.equal(got, want), backend
    listed = range(6) if rows is None else [int(r) for r in rows]
    for r in range(6):
        changed = not torch.equal(want[r], logits[r])
        assert changed == (r in listed)
        if r in listed:
            assert torch.isinf(want[r, 32 * words:]).all()  # past the bitmask: disallowed


def test_allowed_logits_are_untouched_and_unconstrained_rows_skipped(kernel_device):
    logits, bitmask = random_case(3, 100, 4, torch.float32, seed=1, device=kernel_device)
    bitmask[1] = -1  # every token allowed
    got = logits.clone()
    apply_bitmask_(got, bitmask, [1, 2], backend="triton")
    assert torch.equal(got[:2], logits[:2])
    allowed = torch.isfinite(got[2])
    assert torch.equal(got[2][allowed], logits[2][allowed]) and (~allowed).any()


def test_bad_inputs_raise():
    logits, bitmask = random_case(2, 64, 2, torch.float32)
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask_(logits, bitmask.long())
    with pytest.raises(ValueError, match="rows"):
        apply_bitmask_(logits, bitmask[:1])
    with pytest.raises(ValueError, match="backend"):
        apply_bitmask_(logits, bitmask, backend="cuda")
