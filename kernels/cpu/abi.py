"""The contract between the C kernels and their ctypes bindings, checked when a build loads.

The C side (decode.c's rf_abi) reports the sizes of the structures Python builds and the limits
it was compiled with; `check` compares the sizes with the ctypes declarations below and the
layout constants with kernels/cpu/__init__.py's, so a structure or constant changed on one side
only is a clear error at load instead of memory corruption. The limits are defined once, in the
C headers: Python reads them from the library (`Limits`).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# rf_abi's fields, in order
FIELDS = ("sizeof_weight", "sizeof_layer", "sizeof_model", "tile", "group", "format_bf16",
          "format_q4_1", "format_q8_0", "profile_phases", "max_rows", "max_batch", "max_group",
          "max_head_dim", "sizeof_prefill", "sizeof_moe", "format_q6", "format_q4_k",
          "format_q6_k", "format_q5_k", "format_q4_0",
          "format_q5_0", "format_q5_1", "format_iq4_nl", "format_iq4_xs",
          "format_q3_k", "format_q2_k")

# rf_weight.format (gemv.h's enum)
FORMATS = {"bf16": 0, "q4_1": 1, "q8_0": 2, "q6": 3, "q4_k": 4, "q6_k": 5, "q5_k": 6, "q4_0": 7,
           "q5_0": 8, "q5_1": 9, "iq4_nl": 10, "iq4_xs": 11,
           "q3_k": 12, "q2_k": 13}
# decode.c's profile slots, in order
PROFILE_PHASES = ("norms + residuals", "qkv matmul", "rope + KV write", "attention", "o matmul",
                  "gate/up matmul", "SiLU", "down matmul", "head matmul", "router + routing")


class _Weight(ctypes.Structure):
    """rf_weight: a tiled weight, or the first part of a chain (`next`: the rows after)."""


_Weight._fields_ = [("format", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                    ("data", ctypes.c_void_p), ("next", ctypes.POINTER(_Weight))]


class _Moe(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "num_experts", "top_k", "norm_topk_prob", "inter", "shared_inter")] + [
        ("router", ctypes.c_void_p), ("gate_up", ctypes.POINTER(_Weight)),
        ("down", ctypes.POINTER(_Weight)), ("shared_gate_up", _Weight), ("shared_down", _Weight)]


class _Layer(ctypes.Structure):
    _fields_ = [("attn_norm", ctypes.c_void_p), ("ffn_norm", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("qkv_bias", ctypes.c_void_p),
                ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("down", _Weight),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("moe", ctypes.POINTER(_Moe)), ("window", ctypes.c_int64),
                ("k_codes", ctypes.c_void_p), ("v_codes", ctypes.c_void_p),
                ("k_scales", ctypes.c_void_p), ("v_scales", ctypes.c_void_p),
                ("k_offset", ctypes.c_void_p)]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "num_layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "max_context",
        "nthreads", "max_batch", "bf16_inputs", "min_shared_prefix")] + [
        ("eps", ctypes.c_float), ("scale", ctypes.c_float),
        ("layers", ctypes.POINTER(_Layer)), ("final_norm", ctypes.c_void_p),
        ("head", _Weight), ("scratch", ctypes.c_void_p), ("profile", ctypes.c_void_p),
        ("profile_cpu_time", ctypes.c_int64)]


class Prefill(ctypes.Structure):
    """rf_prefill (decode.h): one request's causal attention over its new tokens."""
    _fields_ = [(name, ctypes.c_int64) for name in (
        "n", "prefix", "heads", "kv_heads", "head_dim", "q_stride", "out_stride", "nthreads")] + [
        ("scale", ctypes.c_float), ("q", ctypes.c_void_p), ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p), ("slots", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("k_codes", ctypes.c_void_p), ("v_codes", ctypes.c_void_p),
        ("k_scales", ctypes.c_void_p), ("v_scales", ctypes.c_void_p)]



@dataclass(frozen=True)
class Limits:
    max_rows: int  # rows of x per product call (gemv.h)
    max_batch: int  # requests per decode step (decode.h)
    max_group: int  # query heads per KV head
    max_head_dim: int


def check(lib: ctypes.CDLL, tile: int, group: int) -> Limits:
    """The build's limits; RuntimeError if it disagrees with these bindings."""
    lib.rf_abi.argtypes = [ctypes.c_void_p]
    lib.rf_abi.restype = ctypes.c_int64
    out = (ctypes.c_int64 * len(FIELDS))()
    if lib.rf_abi(out) != len(FIELDS):
        raise RuntimeError("the C kernels report a different ABI (rf_abi's field count)")
    got = dict(zip(FIELDS, out))
    expected = {"sizeof_weight": ctypes.sizeof(_Weight), "sizeof_layer": ctypes.sizeof(_Layer),
                "sizeof_model": ctypes.sizeof(_Model), "tile": tile, "group": group,
                **{f"format_{name}": code for name, code in FORMATS.items()},
                "profile_phases": len(PROFILE_PHASES), "sizeof_prefill": ctypes.sizeof(Prefill),
                "sizeof_moe": ctypes.sizeof(_Moe)}
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    if wrong:
        raise RuntimeError("the C kernels and their Python bindings disagree (C, Python): "
                           + ", ".join(f"{k} {c} vs {p}" for k, (c, p) in wrong.items()))
    return Limits(got["max_rows"], got["max_batch"], got["max_group"], got["max_head_dim"])
