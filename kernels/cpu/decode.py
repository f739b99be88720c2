"""ctypes binding of decode.c: one Llama-family decode step for one token, in one C call.

This module knows the C structures and nothing of radixflow's model classes:
runtime/models/native_decode.py maps a model onto `LayerWeights` and `ModelShape`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from . import TiledWeight, _library

FORMATS = {"bf16": 0, "q4_1": 1, "q8_0": 2}
MAX_GROUP = 16  # query heads per KV head (decode.c keeps one accumulator each)
MAX_HEAD_DIM = 512


class _Weight(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("data", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("qkv_bias", ctypes.c_void_p),
                ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("down", _Weight),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "num_layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "max_context",
        "nthreads")] + [
        ("eps", ctypes.c_float), ("scale", ctypes.c_float),
        ("layers", ctypes.POINTER(_Layer)), ("final_norm", ctypes.c_void_p),
        ("head", _Weight), ("scratch", ctypes.c_void_p), ("profile", ctypes.c_void_p)]


# decode.c's profile slots, in order
PROFILE_PHASES = ("norms + residuals", "qkv matmul", "rope + KV write", "attention", "o matmul",
                  "gate/up matmul", "SiLU", "down matmul", "head matmul")


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
class LayerWeights:
    attn_norm: torch.Tensor  # fp32 [hidden]
    ffn_norm: torch.Tensor
    q_norm: torch.Tensor | None  # fp32 [head_dim]
    k_norm: torch.Tensor | None
    qkv_bias: torch.Tensor | None  # fp32 [q + 2 kv]
    qkv: TiledWeight
    o: TiledWeight
    gate_up: TiledWeight  # gate rows, then up rows
    down: TiledWeight
    k_cache: torch.Tensor  # bf16 [slots, kv_heads, head_dim], written in place
    v_cache: torch.Tensor


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _weight(w: TiledWeight) -> _Weight:
    return _Weight(FORMATS[w.format], w.n, w.k, w.data.data_ptr())


def check_shape(shape: ModelShape) -> str | None:
    """Why decode.c cannot run a model of this shape, or None."""
    if shape.heads % shape.kv_heads or shape.heads // shape.kv_heads > MAX_GROUP:
        return f"{shape.heads} query heads over {shape.kv_heads} KV heads"
    if shape.head_dim % 16 or shape.head_dim > MAX_HEAD_DIM:
        return f"head_dim {shape.head_dim} (needs a multiple of 16, at most {MAX_HEAD_DIM})"
    return None


class DecodeStep:
    """Callable: (embedding, cos, sin, out_slot, slots) -> logits [vocab], float32."""

    def __init__(self, shape: ModelShape, layers: list[LayerWeights], final_norm: torch.Tensor,
                 head: TiledWeight, max_context: int, num_threads: int):
        lib = _library()
        if lib is None:
            raise RuntimeError("the CPU kernels are not available on this machine")
        reason = check_shape(shape)
        if reason:
            raise ValueError(f"decode.c cannot run this model: {reason}")
        self.shape, self.max_context = shape, max_context
        self._keep = (layers, final_norm, head)  # the C side holds raw pointers into these
        self._layers = (_Layer * len(layers))(*[
            _Layer(_ptr(lw.attn_norm), _ptr(lw.ffn_norm), _ptr(lw.q_norm), _ptr(lw.k_norm),
                   _ptr(lw.qkv_bias), _weight(lw.qkv), _weight(lw.o), _weight(lw.gate_up),
                   _weight(lw.down), _ptr(lw.k_cache), _ptr(lw.v_cache))
            for lw in layers])
        self._model = _Model(len(layers), shape.hidden, shape.heads, shape.kv_heads,
                             shape.head_dim, shape.intermediate, shape.vocab, max_context,
                             num_threads, shape.eps, shape.scale, self._layers,
                             _ptr(final_norm), _weight(head), None, None)
        lib.rf_decode_scratch_floats.argtypes = [ctypes.POINTER(_Model)]
        lib.rf_decode_scratch_floats.restype = ctypes.c_int64
        self._scratch = torch.empty(lib.rf_decode_scratch_floats(ctypes.byref(self._model)),
                                    dtype=torch.float32)
        self._model.scratch = self._scratch.data_ptr()
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self._step = lib.rf_decode_step
        self._step.argtypes = [ctypes.POINTER(_Model), ptr, ptr, ptr, i64, ptr, i64, ptr]
        self._step.restype = None
        self._model_ref = ctypes.byref(self._model)

    def profile(self, enable: bool = True) -> dict[str, float] | None:
        """Starts (or stops) adding each step's seconds per phase; returns the sums so far."""
        before = self.profile_seconds()
        self._profile = torch.zeros(len(PROFILE_PHASES), dtype=torch.float64) if enable else None
        self._model.profile = None if self._profile is None else self._profile.data_ptr()
        return before

    def profile_seconds(self) -> dict[str, float] | None:
        if getattr(self, "_profile", None) is None:
            return None
        return dict(zip(PROFILE_PHASES, self._profile.tolist()))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_slot: int,
                 slots: torch.Tensor) -> torch.Tensor:
        """x: fp32 [hidden]; cos, sin: fp32 [head_dim] (this position's rope row); slots:
        int32 [len], the request's KV slots with out_slot last. Writes K/V at out_slot."""
        n = slots.numel()
        if not 0 < n <= self.max_context:
            raise ValueError(f"{n} KV slots, expected 1..{self.max_context}")
        if slots.dtype != torch.int32 or not slots.is_contiguous():
            raise ValueError("slots must be a contiguous int32 tensor")
        logits = torch.empty(1, self.shape.vocab, dtype=torch.float32)
        self._step(self._model_ref, x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out_slot,
                   slots.data_ptr(), n, logits.data_ptr())
        return logits
