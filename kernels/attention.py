"""Paged attention over the token-slot table: dispatch to Triton, plus the torch references.

Both kernels read the K/V pool through `req_to_token` (page size 1: one slot per token).

- extend: request i has `extend_lens[i]` new tokens at rows `extend_starts[i] ..` of q/k/v,
  sitting at positions `prefix_lens[i] ..`. Each new token attends to the request's whole
  cached prefix (slots `req_to_token[req_pool_indices[i], :prefix_lens[i]]`) and causally to
  the new tokens up to itself.
- decode: request i has one query; it attends to positions `0 .. seq_lens[i] - 1`, all read
  through the table (the new token's K/V is already in the pool).
- window (a sliding-window layer; None: none): a query at position p attends only to keys at
  positions p - window < k <= p (transformers' sliding_window_causal_mask_function). The
  Triton kernels skip the key tiles wholly below a query tile's window and mask inside it.

GQA: query head h reads KV head `h // (num_heads // num_kv_heads)`. Softmax in fp32; the
output has q's dtype.

An int8 cache (--kv-cache-dtype int8) is passed as kv_int8.QuantizedRows (codes and scales):
the Triton kernels dequantize each tile they load to q's dtype, the references to fp32.
"""

from __future__ import annotations

import torch

from . import kv_int8
from .dispatch import Backend, pick_backend


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_running, max_context] int32
    req_pool_indices: torch.Tensor,  # [bs]
    prefix_lens: torch.Tensor,  # [bs]
    extend_lens: torch.Tensor,  # [bs]
    extend_starts: torch.Tensor,  # [bs]: first row of each request in q/k/v
    *,
    scale: float,
    max_extend_len: int | None = None,
    window: int | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Attention of each request's new tokens over its cached prefix and causally over
    themselves (within `window`). `max_extend_len` (a host int) spares the Triton path a device
    sync."""
    _check_heads(q, k_cache)
    _check_window(window)
    if pick_backend(backend, q) == "torch":
        return extend_attention_torch(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices,
                                      prefix_lens, extend_lens, extend_starts, scale=scale,
                                      window=window)
    from .triton.extend_attention import extend_attention_triton

    return extend_attention_triton(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices,
                                   prefix_lens, extend_lens, extend_starts, scale=scale,
                                   max_extend_len=max_extend_len, window=window)


def decode_attention(
    q: torch.Tensor,  # [bs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_slots + 1, num_kv_heads, head_dim]
    req_to_token: torch.Tensor,  # [max_running, max_context] int32
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    *,
    scale: float,
    num_kv_splits: int | None = None,
    max_seq_len: int | None = None,
    shared_prefix: object = "auto",
    window: int | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:  # [bs, num_heads, head_dim]
    """One query per request over its positions 0 .. seq_lens[i] - 1. The Triton path splits
    each context into `num_kv_splits` parts (flash-decoding) and merges them in a second kernel;
    None picks a split count from the batch shape. Requests whose slot rows begin alike attend
    over that shared prefix together (triton/decode_attention.py's cascade): shared_prefix is
    its plan (`plan_shared_prefix`, once per forward), "auto" (planned here) or None (off); a
    windowed call attends alone whatever it says. A request with seq_len 0 gets zeros."""
    _check_heads(q, k_cache)
    _check_window(window)
    if pick_backend(backend, q) == "torch":
        return decode_attention_torch(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                      seq_lens, scale=scale, window=window)
    from .triton.decode_attention import decode_attention_triton

    return decode_attention_triton(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                   scale=scale, num_kv_splits=num_kv_splits,
                                   max_seq_len=max_seq_len, shared_prefix=shared_prefix,
                                   window=window)


# ---------------------------------------------------------------------------------------------
# torch references: one request at a time, fp32 math, written to be obviously right.


def extend_attention_torch(q, k, v, k_cache, v_cache, req_to_token, req_pool_indices,
                           prefix_lens, extend_lens, extend_starts, *, scale: float,
                           window: int | None = None):
    out = torch.zeros_like(q)
    for row, prefix_len, extend_len, start in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist(),
        extend_starts.tolist(),
    ):
        if extend_len == 0:
            continue
        new = slice(start, start + extend_len)
        slots = req_to_token[row, :prefix_len].long()
        keys = torch.cat([_rows(k_cache, slots), _as_cached(k[new], k_cache)])
        values = torch.cat([_rows(v_cache, slots), _as_cached(v[new], v_cache)])
        out[new] = attend(q[new], keys, values, scale=scale, first_pos=prefix_len,
                          window=window)
    return out


def decode_attention_torch(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, *,
                           scale: float, window: int | None = None):
    out = torch.zeros_like(q)
    for i, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        if seq_len == 0:
            continue
        slots = req_to_token[row, :seq_len].long()
        out[i:i + 1] = attend(q[i:i + 1], _rows(k_cache, slots), _rows(v_cache, slots),
                              scale=scale, first_pos=seq_len - 1, window=window)
    return out


def attend(
    q: torch.Tensor,  # [num_q, num_heads, head_dim]: positions first_pos .. first_pos+num_q-1
    keys: torch.Tensor,  # [num_k, num_kv_heads, head_dim]: positions 0 .. num_k-1
    values: torch.Tensor,  # [num_k, num_kv_heads, head_dim]
    *,
    scale: float,
    first_pos: int,
    window: int | None = None,
) -> torch.Tensor:  # [num_q, num_heads, head_dim]
    """Causal GQA attention of one request, in fp32; `window`: the query at position p sees
    only the keys at p - window < k <= p."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale  # [heads, num_q, num_k]
    q_pos = first_pos + torch.arange(q.shape[0], device=q.device)
    k_pos = torch.arange(keys.shape[0], device=q.device)
    hidden = k_pos[None, :] > q_pos[:, None]  # [num_q, num_k]
    if window is not None:
        hidden |= k_pos[None, :] <= q_pos[:, None] - window
    scores.masked_fill_(hidden[None], float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)


def _rows(cache, slots: torch.Tensor) -> torch.Tensor:
    """cache[slots]: an int8 cache's (kv_int8.QuantizedRows) dequantized to fp32."""
    if isinstance(cache, kv_int8.QuantizedRows):
        return kv_int8.gather(cache, slots, torch.float32)
    return cache[slots]


def _as_cached(x: torch.Tensor, cache) -> torch.Tensor:
    """New tokens' K or V as the cache holds them (an int8 cache: quantized, then back)."""
    if isinstance(cache, kv_int8.QuantizedRows):
        return kv_int8.dequantize(*kv_int8.quantize(x), torch.float32)
    return x.to(cache.dtype)


def _check_window(window: int | None) -> None:
    if window is not None and (isinstance(window, bool) or int(window) != window or window < 1):
        raise ValueError(f"window must be a positive number of positions or None, got {window!r}")


def _check_heads(q: torch.Tensor, k_cache: torch.Tensor) -> None:
    if q.shape[1] % k_cache.shape[1] != 0:
        raise ValueError(f"num_heads {q.shape[1]} is not a multiple of "
                         f"num_kv_heads {k_cache.shape[1]}")
    if q.shape[-1] != k_cache.shape[-1]:
        raise ValueError(f"q head_dim {q.shape[-1]} != cache head_dim {k_cache.shape[-1]}")
