"""Weight-only quantized linear layers for CPU decode (`--quantization auto|int4`).

Single-stream decode on a CPU is bound by reading the weights, so fewer bytes per weight is
fewer milliseconds per token:
- Int4Linear: groups of 32 input features, asymmetric min-max (GGUF's Q4_1, the scheme of the
  default model's layers), multiplied by torch's packed int4 CPU kernel.
- Q8_0Linear: symmetric int8 groups of 32 (GGUF's Q8_0, the default model's embedding, which
  it ties to its output head), multiplied by radixflow's kernel (kernels/cpu, per CPU level).
Both are exact for weights that came from those formats (see is_exact_*): the default model
is served with its own weights, not an approximation of them.

In a bf16 model the quantized kernels only win for a few rows: above them (prefill, large
decode batches) a layer multiplies bf16 weights with oneDNN's GEMM, either from a bf16 copy of
its (dequantized) weights it keeps, or, without one, a block of output rows at a time
dequantized from its tiles into a scratch buffer (kernels/cpu's gemm_dequant): the copies cost
2 bytes per weight on top of the tiles (2.5 GB for a 1B model held as 0.7 GB of int4), the
blocks a little time. `--cpu-dense-weights` chooses (DenseWeights; an fp32 model keeps no copy
at all: see QuantLinear). QUANT_MAX_ROWS is where the
default model's whole decode step (weights streamed from memory, interleaved A/B) turned:
int4 faster at 8 rows, bf16 at 12 (bench/results/kernel-choices.md#2026-11-29-quant-max-rows).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from radixflow.kernels import cpu as cpu_kernels

from .cpu_linear import PackedLinear, can_pack

logger = logging.getLogger(__name__)

GROUP_SIZE = 32
QUANT_MAX_ROWS = 8  # more rows than this go through the bf16 weights (see the module doc)
# --cpu-dense-weights auto keeps the bf16 copies while they total at most this (DenseWeights)
DENSE_AUTO_LIMIT = 1 << 30


def can_quantize_int4(device: torch.device) -> bool:
    return device.type == "cpu" and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def quantize_groups(weight: torch.Tensor, group_size: int = GROUP_SIZE):
    """weight [N, K] -> (q [N, K] int32 in 0..15, scale [N, K/g], low [N, K/g]) with
    weight ~= low + q * scale."""
    n, k = weight.shape
    groups = weight.float().view(n, k // group_size, group_size)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-10)
    q = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return q.to(torch.int32).view(n, k), scale, low


def _close(weight: torch.Tensor, rebuilt: torch.Tensor, group_size: int = GROUP_SIZE) -> bool:
    n, k = weight.shape
    w = weight.detach().float().view(n, k // group_size, group_size)
    rebuilt = rebuilt.view_as(w)
    return bool(((rebuilt - w).abs() <= 1e-6 * w.abs().amax(-1, keepdim=True)).all())


def is_exact(weight: torch.Tensor, groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             group_size: int = GROUP_SIZE) -> bool:
    """Whether `groups` (from quantize_groups) rebuild `weight` exactly, as they do for weights
    dequantized from a Q4_0/Q4_1 GGUF: then int4 loses nothing but the scales' bf16 rounding."""
    q, scale, low = groups
    n, k = weight.shape
    q = q.view(n, k // group_size, group_size).float()
    return _close(weight, low[..., None] + q * scale[..., None], group_size)


class QuantLinear(nn.Module):
    """Quantized weights; in a bf16 model, above `max_rows` rows, oneDNN's bf16 GEMM over
    either a dense bf16 copy (`dense`, with `dense_copy=True`) or blocks of rows dequantized
    from the tiles at each call (`dense_copy=False`; kernels/cpu's gemm_dequant).

    oneDNN's bf16 GEMM beats the quantized kernels above a few rows (the module doc). An fp32
    model (a CPU without bf16 arithmetic: level avx2) uses neither: there radixflow's kernels
    beat fp32 GEMM at every row count (a 16/128/512-token
    prefill of the default model, torch capped to AVX2: 38 vs 89, 206 vs 254, 758 vs 1219 ms;
    bench/results/cpu-levels.md#2026-12-01),
    and the model holds 98 MB of weights instead of another 540 MB.
    """

    max_rows = QUANT_MAX_ROWS
    # without a copy, the tiled kernels take up to this many rows (at least max_rows), blocks
    # above: one Llama-3.2-1B layer, 1 thread, tiled vs blocks: 14 vs 23 ms at 16 rows, 24 vs
    # 27 at 32, 44 vs 34 at 64 (bench/results/dense-weights.md#2026-12-05)
    blockwise_above = 32
    # ... and where the tiled kernels take those rows' x as int8 (avx512 from
    # cpu_kernels.batch_int8_rows() rows: one vpdpbusd a weight byte), the formats that allow
    # it stay tiled longer (their classes say how long)
    int8_blockwise_above: float = 32
    tiled: cpu_kernels.TiledWeight | None = None  # (set by the subclasses that tile)

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.bfloat16,
                 dense_copy: bool = True):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        self.bf16_gemm = dtype == torch.bfloat16  # above max_rows (copy or blocks)
        self.dense = self._dense_copy(linear) if self.bf16_gemm and dense_copy else None

    @property
    def dense_copy_bytes(self) -> int:
        """What a bf16 copy of the weights takes (held or not)."""
        return self.in_features * self.out_features * 2

    def _dense_copy(self, linear: nn.Linear) -> nn.Module:
        return self._dense_module(linear.weight.detach().to(torch.bfloat16))

    def _dense_module(self, weight: torch.Tensor) -> nn.Module:
        dense = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                          dtype=torch.bfloat16, device="meta")
        dense.weight = nn.Parameter(weight, requires_grad=False)
        if self.bias is not None:
            dense.bias = nn.Parameter(self.bias, requires_grad=False)
        return PackedLinear(dense) if can_pack(dense.weight.device, torch.bfloat16) else dense

    @classmethod
    def from_tiled(cls, tiled: cpu_kernels.TiledWeight, bias: torch.Tensor | None,
                   dtype: torch.dtype = torch.bfloat16, dense_copy: bool = False
                   ) -> QuantLinear:
        """A layer over weights already tiled (a GGUF's blocks, runtime/models/
        stored_linears.py), with no dense weights to start from; `dense_copy`: keep a bf16
        copy (dequantized from the tiles) for many-row products in a bf16 model."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = tiled.k, tiled.n
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.bf16_gemm = dtype == torch.bfloat16
        self.group_size = GROUP_SIZE
        self.tiled = tiled
        self.dense = (self._dense_module(cpu_kernels.dequantize(tiled, dtype=torch.bfloat16))
                      if self.bf16_gemm and dense_copy else None)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features)
        if self.dense is not None and rows.shape[0] > self.max_rows:
            out = self.dense(rows.to(torch.bfloat16))
        elif (self.bf16_gemm and self.tiled is not None
              and rows.shape[0] > max(self.max_rows, self._blockwise_above(rows.shape[0]))):
            out = cpu_kernels.gemm_dequant(rows, self.tiled, torch.bfloat16, self.bias)
        else:
            out = self._quantized(rows)
            if self.bias is not None:
                out = out + self.bias
        return out.view(*shape[:-1], self.out_features).to(x.dtype)

    def _blockwise_above(self, rows: int) -> int:
        fmt, from_rows = self.tiled.format, cpu_kernels.batch_int8_rows()
        int8 = from_rows > 0 and fmt != "q8_0" and (rows >= from_rows
                                                   or fmt in cpu_kernels.INT8_X_FROM_ONE_ROW)
        return self.int8_blockwise_above if int8 else self.blockwise_above

    @staticmethod
    def _out_dtype(rows: torch.Tensor) -> torch.dtype:
        return torch.float32 if rows.dtype == torch.float32 else torch.bfloat16

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


# tiled with x as int8 beats blocks of bf16 rows (oneDNN) at every row count for the 4-bit
# formats, so they never take blocks then: one Llama-3.2-1B layer (qkv, o, gate_up, down), 2
# threads, avx512, tiled vs blocks: q4_k 30 vs 43 ms at 256 rows, 149 vs 170 at 1,024, 653 vs 695
# at 4,096; q4_1 25 vs 44, 121 vs 162, 578 vs 644; q6 52 vs 45 at 256 (its threshold: 128)
NIBBLES_INT8_BLOCKWISE_ABOVE = math.inf


class Int4Linear(QuantLinear):
    """Q4_1-style groups: radixflow's tiled kernel (kernels/cpu) where it runs and the scales
    survive fp16 (as they do for a GGUF's, stored as fp16), else torch's int4 kernel (bf16
    scales)."""

    int8_blockwise_above = NIBBLES_INT8_BLOCKWISE_ABOVE

    def __init__(self, linear: nn.Linear, group_size: int = GROUP_SIZE,
                 groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 dtype: torch.dtype = torch.bfloat16, dense_copy: bool = True):
        """`groups`: `quantize_groups(linear.weight)` when the caller already has it."""
        if linear.in_features % group_size:
            raise ValueError(f"int4 needs in_features divisible by {group_size}, "
                             f"got {linear.in_features}")
        super().__init__(linear, dtype, dense_copy)
        self.group_size = group_size
        q, scale, low = groups or quantize_groups(linear.weight.detach(), group_size)
        self.tiled = _tile_q4_1(q, scale, low) if group_size == cpu_kernels.GROUP else None
        if self.tiled is None:
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            # the kernel computes (q - 8) * scale + zero; [K/g, N, 2]
            zero = low + 8 * scale
            self.scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1) \
                .contiguous().to(torch.bfloat16)

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        if self.tiled is not None:
            return cpu_kernels.gemm(rows, self.tiled, self._out_dtype(rows))
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows.to(torch.bfloat16), self.packed, self.group_size, self.scales_and_zeros)


def _tile_q4_1(q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
               ) -> cpu_kernels.TiledWeight | None:
    """The tiled weight, if the kernels run here and fp16 scales lose no more than the bf16
    scales of torch's kernel would."""
    if not cpu_kernels.available():
        return None
    tiled = cpu_kernels.tile_q4_1(q, scale, low)
    exact = low[..., None] + q.view(*scale.shape, -1).float() * scale[..., None]
    kept = cpu_kernels.unpack(tiled).view_as(exact)
    bf16 = low.bfloat16().float()[..., None] + q.view_as(exact).float() \
        * scale.bfloat16().float()[..., None]
    return tiled if (kept - exact).abs().max() <= (bf16 - exact).abs().max() else None


class Q8_0Linear(QuantLinear):
    # the kernel reads each weight once per call, for up to 8 rows at once
    max_rows = 2

    def __init__(self, linear: nn.Linear, weight: cpu_kernels.Q8_0Weight | None = None,
                 dtype: torch.dtype = torch.bfloat16, dense_copy: bool = True):
        """`weight`: `cpu_kernels.quantize_q8_0(linear.weight)` when the caller already has it."""
        if linear.in_features % GROUP_SIZE:
            raise ValueError(f"Q8_0 needs in_features divisible by {GROUP_SIZE}, "
                             f"got {linear.in_features}")
        super().__init__(linear, dtype, dense_copy)
        weight = weight or cpu_kernels.quantize_q8_0(linear.weight.detach())
        self.tiled = cpu_kernels.tile_q8_0(weight)

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.gemm(rows, self.tiled, self._out_dtype(rows))


class TiledBF16Linear(QuantLinear):
    """A bf16 linear (the output head the int4 path keeps in bf16) whose few-row products go
    through radixflow's tiled bf16 kernel: it streams the weights once per call, where
    oneDNN's bf16 kernel does not reach memory speed for one row; it is also the layout the C
    decode step reads."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.bfloat16,
                 dense_copy: bool = True):
        super().__init__(linear, dtype, dense_copy)
        self.tiled = cpu_kernels.tile_bf16(linear.weight.detach())

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.gemm(rows, self.tiled, self._out_dtype(rows))


class Q6Linear(QuantLinear):
    """Symmetric groups of 16: a GGUF's Q6_K or Q3_K as stored (q6_k, q3_k tiles), or 6-bit
    values with fp16 scales (q6 tiles: a fused layer's Q3_K, Q5_0 or Q4_0 part beside a 6-bit
    one); made from tiles only (QuantLinear.from_tiled)."""

    max_rows = 2
    int8_blockwise_above = 128

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.gemm(rows, self.tiled, self._out_dtype(rows))


class StoredNibblesLinear(QuantLinear):
    """GGUF's Q2_K, Q4_K, Q5_K, Q4_0, Q5_0, Q5_1, IQ4_NL or IQ4_XS as stored (2-, 4- or 5-bit
    values; q2_k: 4-bit scales and mins per 16 under an fp16 d and dmin per 256;
    q4_k, q5_k: six-bit scales and mins per 32 under an fp16 d and dmin per 256; q4_0, q5_0,
    q5_1, iq4_nl: an fp16 d (and m) per 32; iq4_xs: six-bit scales under an fp16 d per 256):
    made from tiles only (QuantLinear.from_tiled)."""

    int8_blockwise_above = NIBBLES_INT8_BLOCKWISE_ABOVE

    def _quantized(self, rows: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.gemm(rows, self.tiled, self._out_dtype(rows))


class StackedLinear(nn.Module):
    """A fused layer (q/k/v, gate/up) whose parts are stored in different types, each part kept
    in its own tiled format: `parts` (tiled QuantLinears, in row order) side by side. The C
    decode step reads them as one chain of weights (kernels/cpu/decode.h's rf_weight)."""

    def __init__(self, parts: list[QuantLinear], bias: torch.Tensor | None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.bias = bias  # the whole layer's (each part adds its rows' share)

    @property
    def tiled_parts(self) -> tuple[cpu_kernels.TiledWeight, ...]:
        return tuple(p.tiled for p in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def tiled_linear(tiled: cpu_kernels.TiledWeight, bias: torch.Tensor | None,
                 dtype: torch.dtype = torch.bfloat16, dense_copy: bool = False) -> QuantLinear:
    """The layer class of `tiled`'s format over it (QuantLinear.from_tiled)."""
    stored = dict.fromkeys(("q2_k", "q4_0", "q4_k", "q5_0", "q5_1", "q5_k", "iq4_nl", "iq4_xs"),
                           StoredNibblesLinear)
    kind = {**stored, "q4_1": Int4Linear, "q6": Q6Linear, "q6_k": Q6Linear, "q3_k": Q6Linear,
            "q8_0": Q8_0Linear,
            "bf16": TiledBF16Linear}[tiled.format]
    return kind.from_tiled(tiled, bias, dtype, dense_copy)


def _quantizable(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    return [(module, name, child) for module in model.modules()
            for name, child in module.named_children()
            if type(child) is nn.Linear and child.in_features % GROUP_SIZE == 0]


DENSE_WEIGHTS = ("auto", "on", "off")


@dataclass(frozen=True)
class DenseWeights:
    """What `--cpu-dense-weights` chose for a model's quantized layers (a bf16 model's: an fp32
    model has no copies to choose): `held` bytes of bf16 copies kept, `saved` bytes of copies
    not kept (those layers dequantize blocks of rows per many-row product instead)."""

    choice: str  # the flag: auto | on | off
    held: int
    saved: int

    @property
    def mode(self) -> str:
        """"on" (copies), "off" (blocks from the tiles) or "none" (no bf16 GEMM: fp32)."""
        return "on" if self.held else "off" if self.saved else "none"

    def as_dict(self) -> dict:
        return {"choice": self.choice, "mode": self.mode, "held_bytes": self.held,
                "saved_bytes": self.saved}

    def describe(self) -> str:
        gib, limit = 2**30, f"{DENSE_AUTO_LIMIT / 2**30:g} GiB"
        flag = f"--cpu-dense-weights {self.choice}"
        if self.mode == "on":
            why = "" if self.choice == "on" else \
                f", at most {limit}" if self.held <= DENSE_AUTO_LIMIT else ", no C kernels"
            return (f"kept bf16 copies of the quantized weights for products over "
                    f"{QUANT_MAX_ROWS} rows: {self.held / gib:.2f} GiB ({flag}{why})")
        if self.mode == "off":
            why = "" if self.choice == "off" else f", over {limit}"
            return (f"no bf16 copies of the quantized weights ({flag}{why}): products over "
                    f"{QuantLinear.blockwise_above} rows dequantize blocks of rows from the "
                    f"tiles; {self.saved / gib:.2f} GiB saved")
        return "no bf16 copies of the quantized weights (an fp32 model needs none)"


def dense_weights_of(model: nn.Module, choice: str = "auto") -> DenseWeights:
    """The bf16 copies a quantized model holds and those it does without."""
    held = saved = 0
    for module in model.modules():
        if isinstance(module, QuantLinear) and module.bf16_gemm:
            if module.dense is not None:
                held += module.dense_copy_bytes
            else:
                saved += module.dense_copy_bytes
    return DenseWeights(choice, held, saved)


def keep_dense_copies(choice: str, copy_bytes: int) -> bool:
    """--cpu-dense-weights: on keeps bf16 copies, off none; auto keeps them while they total at
    most DENSE_AUTO_LIMIT (the default model's 0.27 GB keep its prefill speed, a 1B model's
    2.5 GB are not held beside 0.7 GB of int4), or where no C kernels run (no blocks to
    dequantize: the torch int4 kernel would take every row count)."""
    if choice not in DENSE_WEIGHTS:
        raise ValueError(f"--cpu-dense-weights must be one of {DENSE_WEIGHTS}, got {choice!r}")
    if choice != "auto":
        return choice == "on"
    return copy_bytes <= DENSE_AUTO_LIMIT or not cpu_kernels.available()


def quantize_linears_(model: nn.Module, keep: tuple[nn.Module, ...] = (),
                      only_if_exact: bool = False, dtype: torch.dtype = torch.bfloat16,
                      dense_weights: str = "auto") -> int:
    """Replace the model's nn.Linears (with in_features divisible by the group size) by
    Int4Linears; returns how many linears were replaced (a kept one included). Quantize fp32
    weights, before any bf16 cast.

    - `keep`: linears that do not become int4 unless their weights are already 4-bit. Where
      radixflow's kernels run, one whose weights are exactly 8-bit groups becomes a
      Q8_0Linear; any other a TiledBF16Linear when only exact formats are wanted
      (`only_if_exact`), else a Q8_0Linear too (8-bit groups of its weights: lossy, but
      half the bytes of bf16 for what is often the largest matrix a decode step reads, as
      llama.cpp's Q4_K_M files keep the head in 6 bits); elsewhere it stays as it is.
    - `dtype`: of the dense copies kept for many rows (the model's dtype). For the output
      head: the default model's GGUF stores its (tied) embedding as Q8_0, and 4-bit logits
      cost more quality than the bytes are worth.
    - `only_if_exact`: replace nothing (return 0) unless every other linear's weights are
      already 4-bit (see is_exact), i.e. int4 is lossless for this checkpoint.
    - `dense_weights`: whether a bf16 model's layers keep bf16 copies (keep_dense_copies; one
      log line says what was chosen and what it saved).
    """
    plan = []
    for module, name, linear in _quantizable(model):
        groups = quantize_groups(linear.weight.detach())
        if is_exact(linear.weight, groups):
            plan.append((module, name, Int4Linear, {"groups": groups}))
        elif linear in keep:
            if cpu_kernels.available():
                q8 = cpu_kernels.quantize_q8_0(linear.weight.detach())
                if not only_if_exact or _close(linear.weight, cpu_kernels.unpack_q8_0(q8)):
                    plan.append((module, name, Q8_0Linear, {"weight": q8}))
                else:
                    plan.append((module, name, TiledBF16Linear, {}))
        elif only_if_exact:
            return 0
        else:
            plan.append((module, name, Int4Linear, {"groups": groups}))
    copies = sum(getattr(module, name).weight.numel() * 2 for module, name, _, _ in plan)
    dense_copy = keep_dense_copies(dense_weights, copies if dtype == torch.bfloat16 else 0)
    for module, name, kind, extra in plan:
        setattr(module, name, kind(getattr(module, name), dtype=dtype, dense_copy=dense_copy,
                                   **extra))
    if plan and dtype == torch.bfloat16:
        logger.info("%s", dense_weights_of(model, dense_weights).describe())
    return len(plan)
