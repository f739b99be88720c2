"""Sampling one token per row with per-row temperature, top-k, top-p and min-p; sort-free.

Semantics, for row i with logits x (fp32), T = temperatures[i], m = max(x):

    greedy rows (T < GREEDY_EPS or top_k == 1): token = argmax(x), first index on ties.
    e[j] = exp((x[j] - m) * (1 / T))                      unnormalised probabilities, max 1
    Z = sum(e)
    j is kept iff all the active filters hold:
        top-k (1 < top_k < vocab):  #{t : x[t] > x[j]} < top_k
        top-p (top_p < 1):          sum(e[t] for x[t] > x[j]) < top_p * Z
        min-p (min_p > 0):          e[j] >= min_p
    Filters act jointly on the temperature-scaled distribution (SGLang's and FlashInfer's
    "joint" order): top-p mass is not renormalised after top-k, unlike Hugging Face's
    sequential warpers. Tokens tied with a kept token are kept.

The draw is sort-free rejection sampling driven by uniforms[i, r] in [0, 1), r = round:

    pivot = -inf; mass = Z
    for r in range(num_rounds):
        candidates: x[j] > pivot
        j* = first j in vocab order with  cumsum(e over candidates)[j] > uniforms[i, r] * mass
             (the last candidate with e > 0 if rounding leaves none)
        if j* is kept (or no filter is active): return j*
        pivot = x[j*]; mass = sum(e[t] for x[t] > x[j*])   # every token <= x[j*] is out too
    return argmax(x)                                     # all rounds rejected (vanishingly rare)

Each round draws from e restricted to the candidates, which always contain the kept set, so
an accepted token is an exact draw from e restricted to the kept set. Peaked distributions
accept in round 0; each rejection cuts the candidates at the rejected token. Tokens depend
only on the inputs and `uniforms`, so the Triton kernel and the torch reference agree up to
fp32 rounding of the running sums (a uniform within ~1e-6 of a CDF boundary may pick the
neighbouring token). Rows need at least one finite logit.
"""

from __future__ import annotations

from typing import Literal

import torch

from .dispatch import pick_backend

GREEDY_EPS = 1e-6
DEFAULT_NUM_ROUNDS = 32

SamplingBackend = Literal["auto", "torch", "triton"]


def sample_from_logits(
    logits: torch.Tensor,  # [bs, vocab] float
    temperatures: torch.Tensor,  # [bs] float
    top_ks: torch.Tensor,  # [bs] int: <= 0 or >= vocab disables
    top_ps: torch.Tensor,  # [bs] float in (0, 1]: 1 disables
    min_ps: torch.Tensor,  # [bs] float in [0, 1]: 0 disables
    uniforms: torch.Tensor | None = None,  # [bs, num_rounds] float32 in [0, 1)
    *,
    generator: torch.Generator | None = None,
    num_rounds: int = DEFAULT_NUM_ROUNDS,
    backend: SamplingBackend = "auto",
) -> torch.Tensor:  # [bs] int64
    """One token per row (semantics in the module docstring). Pass `uniforms` for
    reproducible draws (a seeded request fills its own row); otherwise they are drawn with
    `generator`. Logits are not modified. Every tensor (and the generator) must be on the
    logits' device: nothing is copied between devices here.

    Raises
    ------
    ValueError: shapes or devices that do not fit together.
    """
    bs, _ = _check(logits, temperatures, top_ks, top_ps, min_ps, uniforms, generator)
    if uniforms is None:
        uniforms = torch.rand((bs, num_rounds), generator=generator, device=logits.device)
    params = (temperatures.float(), top_ks.to(torch.int32), top_ps.float(), min_ps.float(),
              uniforms.float())
    if pick_backend(backend, logits) == "torch":
        return sample_from_logits_torch(logits, *params)
    from .triton.sampling import sample_from_logits_triton

    return sample_from_logits_triton(logits, *params, greedy_eps=GREEDY_EPS)


def sample_from_logits_torch(logits, temperatures, top_ks, top_ps, min_ps, uniforms):
    """The reference: the algorithm of the module docstring, vectorised over rows."""
    x = logits.float()  # [bs, vocab]
    bs, vocab = x.shape
    argmax = x.argmax(dim=1)  # [bs]
    m = x.gather(1, argmax[:, None])  # [bs, 1]
    greedy = (temperatures < GREEDY_EPS) | (top_ks == 1)
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(temperatures), temperatures)
    e = torch.exp((x - m) * inv_t[:, None])  # [bs, vocab]
    z = e.sum(dim=1)
    top_k_on, top_p_on, min_p_on = _active_filters(top_ks, top_ps, min_ps, vocab)
    unfiltered = ~(top_k_on | top_p_on | min_p_on)
    cols = torch.arange(vocab, device=x.device)

    token = argmax.clone()
    done = greedy.clone()
    pivot = torch.full((bs,), float("-inf"), device=x.device)
    mass = z
    for r in range(uniforms.shape[1]):
        if bool(done.all()):
            break
        e_cand = torch.where(x > pivot[:, None], e, 0.0)
        cdf = e_cand.cumsum(dim=1)
        first = (cdf <= (uniforms[:, r] * mass)[:, None]).sum(dim=1)
        last_positive = torch.where(e_cand > 0, cols, -1).amax(dim=1)
        pick = torch.where(first < vocab, first, last_positive).clamp_(min=0)
        x_pick = x.gather(1, pick[:, None])  # [bs, 1]
        above = x > x_pick
        count_above = above.sum(dim=1)
        mass_above = torch.where(above, e, 0.0).sum(dim=1)
        e_pick = e.gather(1, pick[:, None]).squeeze(1)
        kept = ((~top_k_on | (count_above < top_ks)) & (~top_p_on | (mass_above < top_ps * z))
                & (~min_p_on | (e_pick >= min_ps)))
        accept = ~done & (kept | unfiltered)
        reject = ~done & ~accept
        token = torch.where(accept, pick, token)
        done = done | accept
        pivot = torch.where(reject, x_pick.squeeze(1), pivot)
        mass = torch.where(reject, mass_above, mass)
    return token


def sample_by_race_torch(logits, temperatures, top_ks, top_ps, min_ps, noise) -> torch.Tensor:
    """The same distribution as sample_from_logits (the module docstring's kept set), drawn by
    the exponential race: argmax over kept j of e[j] / noise[j], noise[i, j] ~ Exp(1) [bs,
    vocab]. The CPU's draw: a token changes only when two candidates' race values are within
    the logits' rounding of each other, so a seeded request keeps its tokens when batching
    rounds its logits differently (inverting the CDF over a flat vocabulary moves by the sum
    of every earlier token's rounding). Kept set by one sort: its order puts every token
    strictly above j before j, so the first of each tied group sees count_above and mass_above
    exactly, and the kept sorted positions form a prefix whose last value is the threshold."""
    x = logits.float()
    vocab = x.shape[1]
    argmax = x.argmax(dim=1)
    greedy = (temperatures < GREEDY_EPS) | (top_ks == 1)
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(temperatures), temperatures)
    e = torch.exp((x - x.gather(1, argmax[:, None])) * inv_t[:, None])  # [bs, vocab], max 1
    top_k_on, top_p_on, min_p_on = _active_filters(top_ks, top_ps, min_ps, vocab)
    if bool((top_k_on | top_p_on | min_p_on).any()):
        e_sorted, _ = e.sort(dim=1, descending=True)
        rank = torch.arange(vocab, device=x.device)
        mass_before = e_sorted.cumsum(dim=1) - e_sorted
        z = e_sorted.sum(dim=1, keepdim=True)
        keep = ((~top_k_on[:, None] | (rank < top_ks[:, None]))
                & (~top_p_on[:, None] | (mass_before < top_ps[:, None] * z))
                & (~min_p_on[:, None] | (e_sorted >= min_ps[:, None])))
        last = keep.sum(dim=1, keepdim=True).clamp_(min=1) - 1  # the first token always stays
        e = torch.where(e >= e_sorted.gather(1, last), e, 0.0)
    drawn = (e / noise).argmax(dim=1)
    return torch.where(greedy, argmax, drawn)


def kept_probs_torch(logits, temperatures, top_ks, top_ps, min_ps) -> torch.Tensor:
    """The distribution sample_from_logits draws from, by sorting: [bs, vocab] float32 rows
    summing to 1 (one-hot on greedy rows). For tests and for checking the semantics."""
    x = logits.float()
    vocab = x.shape[1]
    greedy = (temperatures < GREEDY_EPS) | (top_ks == 1)
    inv_t = 1.0 / torch.where(greedy, torch.ones_like(temperatures), temperatures)
    m = x.amax(dim=1, keepdim=True)
    e = torch.exp((x - m) * inv_t[:, None])
    z = e.sum(dim=1, keepdim=True)
    top_k_on, top_p_on, min_p_on = _active_filters(top_ks, top_ps, min_ps, vocab)
    # For each token: how many tokens and how much mass lie strictly above it.
    count_above = (x[:, None, :] > x[:, :, None]).sum(dim=2)  # [bs, vocab]
    mass_above = torch.where(x[:, None, :] > x[:, :, None], e[:, None, :], 0.0).sum(dim=2)
    kept = ((~top_k_on[:, None] | (count_above < top_ks[:, None]))
            & (~top_p_on[:, None] | (mass_above < top_ps[:, None] * z))
            & (~min_p_on[:, None] | (e >= min_ps[:, None])))
    probs = torch.where(kept, e, 0.0)
    probs = probs / probs.sum(dim=1, keepdim=True)
    one_hot = torch.nn.functional.one_hot(x.argmax(dim=1), vocab).float()
    return torch.where(greedy[:, None], one_hot, probs)


def _active_filters(top_ks, top_ps, min_ps, vocab: int):
    return (top_ks > 1) & (top_ks < vocab), top_ps < 1.0, min_ps > 0.0


def _check(logits, temperatures, top_ks, top_ps, min_ps, uniforms, generator) -> tuple[int, int]:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a 2-D float tensor, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    bs, vocab = logits.shape
    if vocab == 0:
        raise ValueError("logits have an empty vocab")
    for name, t in (("temperatures", temperatures), ("top_ks", top_ks), ("top_ps", top_ps),
                    ("min_ps", min_ps)):
        if t.shape != (bs,):
            raise ValueError(f"{name} must have shape ({bs},), got {tuple(t.shape)}")
    if uniforms is not None and (uniforms.dim() != 2 or uniforms.shape[0] != bs
                                 or uniforms.shape[1] < 1):
        raise ValueError(f"uniforms must be [{bs}, num_rounds >= 1], got {tuple(uniforms.shape)}")
    named = {"temperatures": temperatures, "top_ks": top_ks, "top_ps": top_ps, "min_ps": min_ps,
             "uniforms": uniforms, "generator": generator}
    for name, x in named.items():
        if x is not None and x.device != logits.device:
            raise ValueError(f"{name} is on {x.device}, the logits on {logits.device}")
    return bs, vocab
