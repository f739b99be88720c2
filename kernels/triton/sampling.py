"""Triton sort-free sampling: one program per row (semantics: kernels/sampling.py).

Pass 0 finds the max, the first argmax and Z (online). Each rejection round then makes one
early-exit pass for the inverse-CDF draw over the candidates (x > pivot) and, when a filter
is active, one pass counting the tokens and mass above the drawn token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sample_kernel(
    Logits, Temperatures, Top_ks, Top_ps, Min_ps, Uniforms, Out,
    vocab, num_rounds, stride_l, stride_u,
    GREEDY_EPS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = Logits + row * stride_l
    offs = tl.arange(0, BLOCK)
    temperature = tl.load(Temperatures + row)
    top_k = tl.load(Top_ks + row)
    top_p = tl.load(Top_ps + row)
    min_p = tl.load(Min_ps + row)
    greedy = (temperature < GREEDY_EPS) | (top_k == 1)
    inv_t = 1.0 / tl.where(greedy, 1.0, temperature)

    # Pass 0: max, first argmax, Z = sum(exp((x - max) / T)) with online rescaling.
    m = -float("inf")
    argmax = 0
    z = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + offs
        x = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        block_max = tl.max(x, 0)
        argmax = tl.where(block_max > m, start + tl.argmax(x, 0), argmax)
        m_new = tl.maximum(m, block_max)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        z = z * tl.exp((m - m_safe) * inv_t) + tl.sum(tl.exp((x - m_safe) * inv_t), 0)
        m = m_new

    no_top_k = (top_k <= 1) | (top_k >= vocab)
    token = argmax
    done = greedy | (m == -float("inf"))
    pivot = -float("inf")
    mass = z
    r = 0
    while (r < num_rounds) & (done == 0):
        target = tl.load(Uniforms + row * stride_u + r) * mass
        # Inverse CDF over the candidates, in vocab order, stopping at the block that holds it.
        pick = -1
        last_positive = -1
        running = 0.0
        start = 0
        while (pick < 0) & (start < vocab):
            cols = start + offs
            x = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
            e = tl.where(x > pivot, tl.exp((x - m) * inv_t), 0.0)
            block_sum = tl.sum(e, 0)
            if running + block_sum > target:
                cdf = running + tl.cumsum(e, 0)
                num_below = tl.sum((cdf <= target).to(tl.int32), 0)
                if num_below < BLOCK:  # rounding can put the whole block below target
                    pick = start + num_below
            last_positive = tl.maximum(last_positive, tl.max(tl.where(e > 0, cols, -1), 0))
            running += block_sum
            start += BLOCK
        pick = tl.where(pick < 0, tl.maximum(last_positive, 0), pick)
        x_pick = tl.load(base + pick).to(tl.float32)
        e_pick = tl.exp((x_pick - m) * inv_t)

        count_above = 0
        mass_above = 0.0
        if (no_top_k == 0) | (top_p < 1.0) | (min_p > 0.0):
            for start2 in range(0, vocab, BLOCK):
                cols = start2 + offs
                x = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
                above = x > x_pick
                count_above += tl.sum(above.to(tl.int32), 0)
                mass_above += tl.sum(tl.where(above, tl.exp((x - m) * inv_t), 0.0), 0)
        kept = ((no_top_k | (count_above < top_k)) & ((top_p >= 1.0) | (mass_above < top_p * z))
                & ((min_p <= 0.0) | (e_pick >= min_p)))
        token = tl.where(kept, pick, token)
        done = done | kept
        pivot = tl.where(kept, pivot, x_pick)
        mass = tl.where(kept, mass, mass_above)
        r += 1
    tl.store(Out + row, token.to(tl.int64))


def sample_from_logits_triton(logits, temperatures, top_ks, top_ps, min_ps, uniforms, *,
                              greedy_eps: float) -> torch.Tensor:
    bs, vocab = logits.shape
    out = torch.empty(bs, dtype=torch.int64, device=logits.device)
    if bs == 0:
        return out
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    uniforms = uniforms.contiguous()
    block = 2048 if logits.is_cuda else 256
    _sample_kernel[(bs,)](
        logits, temperatures.contiguous(), top_ks.contiguous(), top_ps.contiguous(),
        min_ps.contiguous(), uniforms, out,
        vocab, uniforms.shape[1], logits.stride(0), uniforms.stride(0),
        GREEDY_EPS=greedy_eps,
        BLOCK=block,
        num_warps=8 if logits.is_cuda else 4,
    )
    return out
