"""ctypes binding of decode.c: one Llama-family decode step (one token for each of up to
`Limits.max_batch` requests, 64) in one C call, in the build of the CPU level its weights were
tiled at.

This module knows the C structures and nothing of radixflow's model classes:
runtime/models/cpu_decode.py maps a model onto `LayerWeights` and `ModelShape`.

Requests of a step whose slot rows begin with the same `min_shared_prefix` or more slots (a
prefix the radix cache holds once) attend over that prefix together, as one matrix product per
block of its keys for all their queries, merged with each one's own keys by log-sum-exp
(decode.c's find_groups, step_<level>.c's rf_attend_shared); the scheduler need not know.
Layers with a sliding window (`LayerWeights.window`) attend each request over its window
alone, never over a shared prefix.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from . import TILE, TiledWeight, _library, limits
from .abi import FORMATS, PROFILE_PHASES, Limits, _Layer, _Model, _Moe, _Weight

# Shared prefixes shorter than this attend per request: below it the per-request path costs
# about as little (bench/results/cascade-attention.md).
MIN_SHARED_PREFIX = 64


@dataclass
class ModelShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    scale: float  # attention's softmax scale


@dataclass
class MoeWeights:
    """A mixture-of-experts MLP (decode.h's rf_moe): router logits in fp32, a softmax, the
    top_k (renormalised if norm_topk_prob), each routed expert a SiLU-gated MLP; plus, where
    given, a shared expert scaled by sigmoid(shared_gate . x) (Qwen2-MoE)."""

    router: torch.Tensor  # fp32 [experts, hidden]
    gate_up: list[TiledWeight]  # each expert's: gate rows, then up rows
    down: list[TiledWeight]
    top_k: int
    norm_topk_prob: bool
    shared_gate: torch.Tensor | None = None  # fp32 [hidden]
    shared_gate_up: TiledWeight | None = None
    shared_down: TiledWeight | None = None

    def weights(self) -> list[TiledWeight]:
        shared = [self.shared_gate_up, self.shared_down] if self.shared_gate_up else []
        return [*self.gate_up, *self.down, *shared]

    def check(self, hidden: int) -> str | None:
        """Why decode.c cannot run this layer's MLP, or None."""
        experts = len(self.gate_up)
        if len(self.down) != experts or not 0 < self.top_k <= experts:
            return f"top {self.top_k} of {experts} experts ({len(self.down)} down products)"
        if tuple(self.router.shape) != (experts, hidden):
            return f"a router of shape {tuple(self.router.shape)}"
        if (self.shared_gate_up is None) != (self.shared_down is None) or (
                (self.shared_gate is None) != (self.shared_gate_up is None)):
            return "a shared expert without its gate (or the reverse)"
        inter = self.down[0].k
        if any(gu.shape != (2 * inter, hidden) or d.shape != (hidden, inter)
               for gu, d in zip(self.gate_up, self.down)):
            return "experts of different shapes"
        if self.shared_gate_up is not None:
            si = self.shared_down.k
            if (self.shared_gate_up.shape != (2 * si, hidden)
                    or self.shared_down.shape != (hidden, si)):
                return "a shared expert of an odd shape"
        # (one split of each row's input feeds every gate/up product)
        gate_ups = [*self.gate_up, *([self.shared_gate_up] if self.shared_gate_up else [])]
        if len({w.format for w in gate_ups}) != 1:
            return "gate/up weights of different formats in one layer"
        return None


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # fp32 [hidden]
    ffn_norm: torch.Tensor
    q_norm: torch.Tensor | None  # fp32 [head_dim]
    k_norm: torch.Tensor | None
    qkv_bias: torch.Tensor | None  # fp32 [q + 2 kv]
    # each a TiledWeight, or a fused layer's parts stored apart (Parts: rows in order)
    qkv: TiledWeight | Parts
    o: TiledWeight | Parts
    gate_up: TiledWeight | Parts | None  # gate rows, then up rows (None in a MoE layer)
    down: TiledWeight | Parts | None
    # bf16 [slots, kv_heads, head_dim], written in place; or an int8 cache's codes, with
    # k_scales / v_scales (fp16 [slots, kv_heads]: kernels/kv_int8.py)
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    moe: MoeWeights | None = None  # the MLP of a mixture-of-experts layer, else gate_up, down
    window: int = 0  # a sliding window: each row attends its last `window` keys; 0: all
    k_scales: torch.Tensor | None = None
    v_scales: torch.Tensor | None = None
    k_offset: torch.Tensor | None = None  # an int8 cache's: fp32 [kv_heads, head_dim] or None

    def weights(self) -> list[TiledWeight]:
        mlp = self.moe.weights() if self.moe else [self.gate_up, self.down]
        return [part for w in (self.qkv, self.o, *mlp) for part in _parts(w)]


# a fused layer whose parts are kept in different formats: its rows, part after part
Parts = tuple[TiledWeight, ...]


def _parts(w: TiledWeight | Parts | None) -> Parts:
    return () if w is None else (w,) if isinstance(w, TiledWeight) else tuple(w)


def check_parts(parts: Parts, max_parts: int = 3) -> str | None:
    """Why decode.c cannot read `parts` as one chain of weights (decode.h's rf_weight), or
    None."""
    if not 1 <= len(parts) <= max_parts:
        return f"{len(parts)} parts in one weight (at most {max_parts})"
    if len({p.k for p in parts}) != 1:
        return "parts with different in_features"
    if any(p.n % TILE for p in parts[:-1]):
        return f"a part of {[p.n for p in parts]} rows that is not whole tiles of {TILE}"
    return None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _weight(w: TiledWeight | Parts | None, keep: list | None = None) -> _Weight:
    """The C structure of a weight; a chain's later parts are appended to `keep` (the C side
    points into them)."""
    parts = _parts(w)
    if not parts:
        return _Weight()
    if len(parts) > 1 and (reason := check_parts(parts)):
        raise ValueError(f"decode.c cannot read these parts as one weight: {reason}")
    after = None
    for p in reversed(parts[1:]):
        after = _Weight(FORMATS[p.format], p.n, p.k, p.data.data_ptr(),
                        None if after is None else ctypes.pointer(after))
        keep.append(after)
    head = parts[0]
    return _Weight(FORMATS[head.format], head.n, head.k, head.data.data_ptr(),
                   None if after is None else ctypes.pointer(after))


def _moe(moe: MoeWeights) -> tuple[_Moe, tuple]:
    """The C structure of a MoE layer, and what it points into (to keep alive)."""
    router = moe.router.float()
    if moe.shared_gate is not None:  # (decode.c reads the shared gate as one more router row)
        router = torch.cat([router, moe.shared_gate.float().view(1, -1)])
    router = router.contiguous()
    experts = len(moe.gate_up)
    gate_up = (_Weight * experts)(*map(_weight, moe.gate_up))
    down = (_Weight * experts)(*map(_weight, moe.down))
    shared = 0 if moe.shared_down is None else moe.shared_down.k
    c = _Moe(experts, moe.top_k, int(moe.norm_topk_prob), moe.down[0].k, shared,
             router.data_ptr(), gate_up, down, _weight(moe.shared_gate_up),
             _weight(moe.shared_down))
    return c, (router, gate_up, down, moe)


def check_shape(shape: ModelShape, lim: Limits) -> str | None:
    """Why decode.c (built with limits `lim`) cannot run a model of this shape, or None."""
    if shape.heads % shape.kv_heads or shape.heads // shape.kv_heads > lim.max_group:
        return f"{shape.heads} query heads over {shape.kv_heads} KV heads"
    if shape.head_dim % 16 or shape.head_dim > lim.max_head_dim:
        return (f"head_dim {shape.head_dim} (needs a multiple of 16, at most "
                f"{lim.max_head_dim})")
    return None


def _kv_cache(lw: LayerWeights, shape: ModelShape) -> tuple[int | None, int | None]:
    """rf_layer's k_cache, v_cache: a bf16 cache's, (None, None) for an int8 one."""
    if lw.k_cache.dtype == torch.int8:
        return None, None
    if lw.k_cache.dtype != torch.bfloat16 or lw.v_cache.dtype != torch.bfloat16:
        raise ValueError(f"decode.c reads a bf16 or int8 KV cache, not {lw.k_cache.dtype}")
    return _ptr(lw.k_cache), _ptr(lw.v_cache)


def _kv_int8(lw: LayerWeights, shape: ModelShape) -> tuple[int | None, ...]:
    """rf_layer's k_codes, v_codes, k_scales, v_scales, k_offset (an int8 cache), else
    Nones."""
    if lw.k_cache.dtype != torch.int8:
        return None, None, None, None, None
    rows = lw.k_cache.shape[0]
    for t, shp, dtype in ((lw.k_cache, (rows, shape.kv_heads, shape.head_dim), torch.int8),
                          (lw.v_cache, (rows, shape.kv_heads, shape.head_dim), torch.int8),
                          (lw.k_scales, (rows, shape.kv_heads), torch.float16),
                          (lw.v_scales, (rows, shape.kv_heads), torch.float16)):
        if t is None or t.dtype != dtype or tuple(t.shape) != shp or not t.is_contiguous():
            raise ValueError("an int8 KV cache needs contiguous int8 codes [slots, kv_heads, "
                             "head_dim] and fp16 scales [slots, kv_heads] for K and V")
    offset = lw.k_offset
    if offset is not None and (offset.dtype != torch.float32 or not offset.is_contiguous()
                               or tuple(offset.shape) != (shape.kv_heads, shape.head_dim)):
        raise ValueError("an int8 KV cache's key offset must be contiguous fp32 [kv_heads, "
                         "head_dim]")
    return (_ptr(lw.k_cache), _ptr(lw.v_cache), _ptr(lw.k_scales), _ptr(lw.v_scales),
            _ptr(offset))


class DecodeStep:
    """Callable: one token for each of up to `max_batch` requests -> their logits (float32)."""

    def __init__(self, shape: ModelShape, layers: list[LayerWeights], final_norm: torch.Tensor,
                 head: TiledWeight, max_context: int, num_threads: int,
                 max_batch: int | None = None, bf16_inputs: bool = True,
                 min_shared_prefix: int = MIN_SHARED_PREFIX):
        """max_batch: requests per call (default: the build's limit); bf16_inputs: the model
        is bf16 (its products' inputs are rounded to bf16), else fp32; min_shared_prefix: the
        shortest prefix of KV slots that requests attend over together (0: never)."""
        levels = {w.level for lw in layers for w in lw.weights()}
        if len(levels | {head.level}) != 1:
            raise ValueError(f"weights tiled at different CPU levels: {levels | {head.level}}")
        self.level = head.level
        lib = _library(self.level) if self.level else None
        if lib is None:
            raise RuntimeError("the CPU kernels are not available on this machine")
        lim = limits(self.level)
        reason = check_shape(shape, lim)
        if reason:
            raise ValueError(f"decode.c cannot run this model: {reason}")
        max_batch = lim.max_batch if max_batch is None else max_batch
        if not 1 <= max_batch <= lim.max_batch:
            raise ValueError(f"max_batch must be 1..{lim.max_batch}, got {max_batch}")
        for i, lw in enumerate(layers):
            reason = (lw.moe.check(shape.hidden) if lw.moe is not None else
                      None if lw.gate_up is not None and lw.down is not None else "no MLP")
            if reason:
                raise ValueError(f"decode.c cannot run layer {i}: {reason}")
        self.shape, self.max_context, self.max_batch = shape, max_context, max_batch
        self._keep = (layers, final_norm, head)  # the C side holds raw pointers into these
        self._moes = moes = [None if lw.moe is None else _moe(lw.moe) for lw in layers]
        self._chains: list[_Weight] = []  # chains' later parts (the layers point at them)
        chain = functools.partial(_weight, keep=self._chains)
        self._layers = (_Layer * len(layers))(*[
            _Layer(_ptr(lw.attn_norm), _ptr(lw.ffn_norm), _ptr(lw.q_norm), _ptr(lw.k_norm),
                   _ptr(lw.qkv_bias), chain(lw.qkv), chain(lw.o), chain(lw.gate_up),
                   chain(lw.down), *_kv_cache(lw, shape),
                   None if moe is None else ctypes.pointer(moe[0]), lw.window,
                   *_kv_int8(lw, shape))
            for lw, moe in zip(layers, moes)])
        self._model = _Model(len(layers), shape.hidden, shape.heads, shape.kv_heads,
                             shape.head_dim, shape.intermediate, shape.vocab, max_context,
                             num_threads, max_batch, int(bf16_inputs), min_shared_prefix,
                             shape.eps, shape.scale,
                             self._layers, _ptr(final_norm), _weight(head), None, None, 0)
        lib.rf_decode_scratch_floats.argtypes = [ctypes.POINTER(_Model)]
        lib.rf_decode_scratch_floats.restype = ctypes.c_int64
        self._scratch = torch.empty(lib.rf_decode_scratch_floats(ctypes.byref(self._model)),
                                    dtype=torch.float32)
        self._model.scratch = self._scratch.data_ptr()
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._step = lib.rf_decode_batch
        self._step.argtypes = [ctypes.POINTER(_Model), i64, ptr, ptr, ptr, ptr, ptr, i64, ptr, ptr,
                               i64, ptr]
        self._step.restype = None
        self._model_ref = ctypes.byref(self._model)
        self._lib = lib
        lib.rf_shared_prefixes.argtypes = [ctypes.POINTER(_Model), i64, ptr, i64, ptr, ptr, ptr]
        lib.rf_shared_prefixes.restype = i64
        lib.rf_shared_work_floats.argtypes = [ctypes.POINTER(_Model)]
        lib.rf_shared_work_floats.restype = i64
        lib.rf_attend_part.argtypes = [ctypes.POINTER(_Model), ptr, ptr, ptr, ptr, i64, i64, ptr,
                                       ptr]
        lib.rf_attend_part.restype = None
        lib.rf_attend_shared.argtypes = [ctypes.POINTER(_Model), ptr, i64, ptr, ptr, ptr, i64,
                                         i64, ptr, ptr]
        lib.rf_attend_shared.restype = None

    @property
    def min_shared_prefix(self) -> int:
        """Requests whose slot rows begin with at least this many equal slots attend over them
        together; 0 turns sharing off (every request attends alone)."""
        return self._model.min_shared_prefix

    @min_shared_prefix.setter
    def min_shared_prefix(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"min_shared_prefix must be >= 0, got {value}")
        self._model.min_shared_prefix = value

    def shared_prefixes(self, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                        lens: torch.Tensor) -> list[int]:
        """How many leading KV slots each request of a step (as `__call__` takes them) attends
        over together with others: its group's shared prefix, or 0 (it attends alone)."""
        batch = len(req_pool_indices)
        if not 0 < batch <= self.max_batch:
            raise ValueError(f"{batch} requests, expected 1..{self.max_batch}")
        rows = req_pool_indices.to(torch.int64).contiguous()
        lens = lens.to(torch.int64).contiguous()
        table = req_to_token.to(torch.int32).contiguous()
        if int(lens.min()) < 1 or int(lens.max()) > table.shape[1]:
            raise ValueError(f"KV lengths must be 1..{table.shape[1]}")
        out = torch.zeros(batch, dtype=torch.int64)
        self._lib.rf_shared_prefixes(self._model_ref, batch, table.data_ptr(), table.shape[1],
                                     rows.data_ptr(), lens.data_ptr(), out.data_ptr())
        return out.tolist()

    def attend(self, layer: int, q: torch.Tensor, slots: torch.Tensor, *,
               together: bool) -> torch.Tensor:
        """The step's attention kernels alone (one thread; for tests and benchmarks): each of n
        requests' queries q (fp32 [n, heads, head_dim]) over the same KV slots (int32) of layer
        `layer`'s cache, by rf_attend_shared (together) or rf_attend_part per request. Returns
        the outputs, fp32 [n, heads, head_dim]."""
        n, heads, dim = q.shape
        shape = self.shape
        if (heads, dim) != (shape.heads, shape.head_dim) or not 0 < n <= self.max_batch:
            raise ValueError(f"q must be [1..{self.max_batch}, {shape.heads}, "
                             f"{shape.head_dim}], got {tuple(q.shape)}")
        q = q.float().contiguous()
        qs = (dim + 31) // 32 * 32
        qb = torch.zeros(n, heads, qs, dtype=torch.bfloat16)
        qb[..., :dim] = q
        slots = slots.to(torch.int32).contiguous()
        keys = len(slots)
        partial = torch.zeros(n, heads, dim + 2)
        lib, layer_ref = self._lib, ctypes.byref(self._layers[layer])
        if together:
            work = torch.empty(lib.rf_shared_work_floats(self._model_ref))
            ptrs = ctypes.c_void_p * n
            lib.rf_attend_shared(self._model_ref, layer_ref, n,
                                 ptrs(*[q[i].data_ptr() for i in range(n)]),
                                 ptrs(*[qb[i].data_ptr() for i in range(n)]), slots.data_ptr(),
                                 0, keys, work.data_ptr(),
                                 ptrs(*[partial[i].data_ptr() for i in range(n)]))
        else:
            scores = torch.empty(heads * max(keys, 1) + 16)
            for i in range(n):
                lib.rf_attend_part(self._model_ref, layer_ref, q[i].data_ptr(), qb[i].data_ptr(),
                                   slots.data_ptr(), 0, keys, scores.data_ptr(),
                                   partial[i].data_ptr())
        return partial[..., 2:] / partial[..., 1:2]

    def profile(self, enable: bool = True, cpu_time: bool = False) -> dict[str, float] | None:
        """Starts (or stops) adding each step's seconds per phase (thread 0's: wall time, or
        with cpu_time its CPU time, which time other processes held the core leaves out);
        returns the sums so far."""
        before = self.profile_seconds()
        self._model.profile_cpu_time = int(cpu_time)
        self._profile = torch.zeros(len(PROFILE_PHASES), dtype=torch.float64) if enable else None
        self._model.profile = None if self._profile is None else self._profile.data_ptr()
        return before

    def profile_seconds(self) -> dict[str, float] | None:
        if getattr(self, "_profile", None) is None:
            return None
        return dict(zip(PROFILE_PHASES, self._profile.tolist()))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 out_slots: torch.Tensor, req_to_token: torch.Tensor,
                 req_pool_indices: torch.Tensor,
                 lens: torch.Tensor, logit_rows: int | None = None) -> torch.Tensor:
        """One token for each of B rows. x: fp32 [B, hidden] (embeddings); cos, sin: fp32
        [B, head_dim] (their positions' rope rows); out_slots: int64 [B], where their K/V go;
        req_to_token: the int32 [requests, context] request -> KV slot table, whose row
        req_pool_indices[r] holds row r's lens[r] slots (out_slots[r] last);
        req_pool_indices, lens: int64 [B]. Several rows may be one request's consecutive
        tokens (each sees the K/V of those before it).
        Returns the logits of the first `logit_rows` rows (default all), [logit_rows, vocab]."""
        batch = x.shape[0]
        if not 0 < batch <= self.max_batch:
            raise ValueError(f"{batch} requests, expected 1..{self.max_batch}")
        logit_rows = batch if logit_rows is None else logit_rows
        if not 0 <= logit_rows <= batch:
            raise ValueError(f"logit_rows must be 0..{batch}, got {logit_rows}")
        for name, t, dtype in (("x", x, torch.float32), ("cos", cos, torch.float32),
                               ("sin", sin, torch.float32), ("out_slots", out_slots, torch.int64),
                               ("req_to_token", req_to_token, torch.int32),
                               ("req_pool_indices", req_pool_indices, torch.int64),
                               ("lens", lens, torch.int64)):
            if t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"{name} must be a contiguous {dtype} tensor")
        if int(lens.min()) < 1 or int(lens.max()) > min(self.max_context, req_to_token.shape[1]):
            raise ValueError(f"KV lengths must be 1..{self.max_context}")
        logits = torch.empty(logit_rows, self.shape.vocab, dtype=torch.float32)
        self._step(self._model_ref, batch, x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                   out_slots.data_ptr(), req_to_token.data_ptr(), req_to_token.shape[1],
                   req_pool_indices.data_ptr(), lens.data_ptr(), logit_rows, logits.data_ptr())
        return logits
