"""A GGUF's linear layers and embedding, from their stored blocks straight into the C kernels'
tiles: no float32 model, no dense weights (unless --cpu-dense-weights keeps bf16 copies).

Each stored type goes to the nearest tiled format radixflow's kernels multiply (every CPU
level has them all):
- Q4_K -> q4_k, as stored (4-bit values, six-bit scales and mins per 32, an fp16 d and dmin
  per 256: 4.5 bits a weight); at avx2 -> q4_1 (its batch products are ~10-40% faster there:
  bench/results/scale-serving.md#2026-12-06-avx2-avx2-q4k);
- Q5_K -> q5_k, as stored (q4_k's fields with 5-bit values: 5.5 bits a weight); a Q4_K part
  of a fused layer whose other part is Q5_K too, exactly (its fifth bits zero);
- Q4_0 -> q4_0, as stored (fp16 d per 32, the 4-bit values: 4.5 bits a weight); Q5_0, Q5_1 ->
  q5_0, q5_1, as stored (fp16 d (and m) per 32, the 5-bit values: 5.5 and 6 bits a weight);
- Q4_1 -> q4_1 (groups of 32 with a scale and a low value, fp16); a Q4_0 part of a fused layer
  whose other part is not Q4_0 too (low -8 d, exactly), and a Q4_K part of one whose other part
  is Q4_0/Q4_1 (its sub-blocks of 32 are such groups, scale d*sc and
  low -dmin*m, held as fp16);
- Q6_K -> q6_k, as stored (6-bit values, an int8 scale per 16 under an fp16 d per 256: 6.5625
  bits a weight);
- Q3_K -> q3_k, as stored (3-bit values, an int8 scale per 16 under an fp16 d per 256, as
  q6_k holds its: 3.5625 bits a weight, GGUF's 3.4375); in a fused layer whose parts cannot
  stand apart -> q6 (6-bit symmetric values with a scale per 16: its sub-blocks of 16 with
  scale d*sc, held as fp16), as Q6_K, Q5_0 and Q4_0 parts there;
- IQ4_NL -> iq4_nl, as stored (fp16 d per 32, the 4-bit indices into IQ4's 16 values: 4.5
  bits a weight); IQ4_XS -> iq4_xs, as stored (an fp16 d per 256, a six-bit scale per 32, the
  indices: 4.31 bits a weight, GGUF's 4.25); in a fused layer beside another type -> q8_0,
  exactly (their indices' int8 values, the scale d or d * sc per 32: no narrower format holds
  both);
- Q8_0 -> q8_0, exactly;
- F32, F16, BF16 -> bf16 tiles (F16 and F32 weights rounded to bf16: no fp16 format yet);
- Q2_K -> q2_k, as stored (2-bit values, 4-bit scales and mins per 16 under an fp16 d and
  dmin per 256: 2.625 bits a weight, as the file); in a fused layer whose parts cannot stand
  apart -> q8_0, its blocks dequantized and requantized to 8-bit groups of 32 (no narrower
  format holds its groups; an 8-bit grid keeps them within 1/254 of each group's largest
  weight).
A fused layer (q/k/v, gate/up) whose parts take different formats keeps each run of parts
in its own (a StackedLinear: a Q4_K_M's Q4_K q/k as q4_k beside its Q6_K v as q6_k), where
the runs end on a tile's edge; otherwise (and within a run of one format) it takes the widest
format of its parts (bf16 > q8_0 > q6 > q6_k > q5_k > q5_1 > q5_0 > q4_1 > q4_0 > q4_k; q6_k
only where every part is Q6_K, q5_k only where every part is Q5_K or Q4_K, else q6; q4_0 and
q5_0 only where every part is theirs, else q4_1 and q5_1, which hold Q4_0/Q5_0 exactly). With
--quantization int4 every layer but the output head becomes q4_1, or q4_k (q4_0) where it is
all Q4_K (Q4_0) (its stored values requantized to 4-bit groups where they are not 4-bit
already; iq4_nl and iq4_xs stay). One log line says what became what, and why.

The embedding becomes a TiledEmbedding over the same kind of tiles (the output head's, shared,
when the model ties them), dequantizing the rows a batch looks up.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

import torch
from torch import nn

from radixflow.kernels import cpu as cpu_kernels
from radixflow.kernels.gguf_blocks import (
    GGMLType,
    affine_groups,
    iq4_fields,
    q2_k_fields,
    q3_k_fields,
    q4_k_fields,
    q6_k_fields,
    symmetric_6bit_groups,
    symmetric_int8_groups,
)

from .. import host_memory
from ..model_loader.gguf_tensors import CHUNK_ROWS, GGUFWeights, StoredTensor
from .llama import _map_hf_name
from .quant_linear import (
    QuantLinear,
    StackedLinear,
    keep_dense_copies,
    quantize_groups,
    tiled_linear,
)

logger = logging.getLogger(__name__)

_AFFINE_4BIT = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K)  # q4_1 holds each
_SYMMETRIC_6BIT = (GGMLType.Q6_K, GGMLType.Q3_K)
# (Q4_0's q - 8 and Q5_0's q - 16 with scale d, in a fused layer's q6)
_FITS_6BIT = (*_SYMMETRIC_6BIT, GGMLType.Q4_0, GGMLType.Q5_0)
_FIVE_BIT_GROUPS = {GGMLType.Q5_0: "q5_0", GGMLType.Q5_1: "q5_1"}
_FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_IQ4 = {GGMLType.IQ4_NL: "iq4_nl", GGMLType.IQ4_XS: "iq4_xs"}
_INT8_VALUES = (GGMLType.Q8_0, *_IQ4)  # exactly q8_0
# (q2_k, q3_k, iq4_*: only where every part is that type: layer_format)
_WIDTH = {"q2_k": -4, "q3_k": -3, "iq4_xs": -2, "iq4_nl": -1, "q4_k": 0, "q4_0": 1, "q4_1": 2,
          "q5_0": 3, "q5_1": 4, "q5_k": 5, "q6_k": 6, "q6": 7, "q8_0": 8, "bf16": 9}
_ONLY_IN_Q8_0 = {*_IQ4, GGMLType.Q2_K}  # beside another type, no narrower format holds them
_WHY = {"q2_k": "as stored",
        "q3_k": "as stored",
        "iq4_nl": "as stored",
        "iq4_xs": "as stored",
        "q4_k": "as stored",
        "q4_0": "as stored",
        "q5_0": "as stored",
        "q5_1": "as stored",
        "q5_k": "as stored",
        "q6_k": "as stored",
        "q4_1": "groups of 32 as stored, fp16 scales",
        "q6": "groups of 16 as stored, fp16 scales",
        "q8_0": "exact",
        "bf16": "exact"}


def nearest_format(qtype: GGMLType) -> str:
    if qtype == GGMLType.Q4_K and cpu_kernels.active_level() != "avx2":
        return "q4_k"
    if qtype == GGMLType.Q4_0:
        return "q4_0"
    if qtype in _FIVE_BIT_GROUPS:
        return _FIVE_BIT_GROUPS[qtype]
    if qtype in _IQ4:
        return _IQ4[qtype]
    if qtype in _AFFINE_4BIT:
        return "q4_1"
    if qtype == GGMLType.Q5_K:
        return "q5_k"
    if qtype == GGMLType.Q6_K:
        return "q6_k"
    if qtype == GGMLType.Q3_K:
        return "q3_k"
    if qtype == GGMLType.Q2_K:
        return "q2_k"
    if qtype in _FLOATS:
        return "bf16"
    return "q8_0"


def layer_format(types: set[GGMLType]) -> str:
    """The format of a layer whose parts are stored in `types`: the widest of theirs, q6_k only
    where every part is Q6_K (its int8 scales under one d per 256 cannot hold another type's
    groups as they are: q6's fp16 scale per 16 can), q5_k only where every part is Q5_K or
    Q4_K (the same fields), else q6; iq4_nl, iq4_xs and q2_k only where every part is that
    type, else q8_0 (or wider: it holds IQ4's values exactly, Q2_K's requantized); q3_k only
    where every part is Q3_K, else q6 (or wider)."""
    if len(types) > 1 and types & _ONLY_IN_Q8_0:
        others = types - _ONLY_IN_Q8_0
        return max(["q8_0", *(nearest_format(t) for t in others)], key=_WIDTH.get)
    if len(types) > 1 and GGMLType.Q3_K in types:  # (q6 holds its groups of 16 as they are)
        return max(["q6", *(nearest_format(t) for t in types - {GGMLType.Q3_K})], key=_WIDTH.get)
    fmt = max((nearest_format(t) for t in types), key=_WIDTH.get)
    if fmt == "q6_k" and types != {GGMLType.Q6_K}:
        return "q6"
    if fmt == "q5_k" and not types <= {GGMLType.Q5_K, GGMLType.Q4_K}:
        return "q6"
    if fmt == "q4_0" and types != {GGMLType.Q4_0}:
        return "q4_1"
    if fmt == "q5_0" and types != {GGMLType.Q5_0}:
        return "q5_1"  # (every other part is a narrower affine type: q5_1 holds it)
    return fmt


_OFFSET = {GGMLType.Q4_0: 8, GGMLType.Q5_0: 16}  # w = d (q - offset)


def why(qtype: GGMLType, fmt: str) -> str:
    if fmt == "q6" and qtype == GGMLType.Q4_0:
        return "a fused layer's widest part: its values kept exactly"
    if fmt == "q6" and qtype in _SYMMETRIC_6BIT:
        return "a fused layer's widest part: its values kept, scales d*sc as fp16"
    if fmt == "q4_1" and qtype == GGMLType.Q4_K and nearest_format(qtype) == "q4_1":
        return ("groups of 32, fp16 scales: at avx2 q4_1's products beat q4_k's for a batch "
                "(its six-bit scales cost more to unpack there than its 10% fewer bytes save)")
    if fmt == "q4_1" and qtype == GGMLType.Q4_K:
        return "a fused layer's widest part: groups of 32, fp16 scales"
    if fmt in ("q4_1", "q5_1") and qtype in (GGMLType.Q4_0, GGMLType.Q5_0):
        return f"a fused layer's widest part: its groups as stored, low -{_OFFSET[qtype]} d"
    if fmt == "q5_1" and qtype == GGMLType.Q4_1:
        return "a fused layer's widest part: its groups as stored"
    if fmt == "q5_1" and qtype == GGMLType.Q4_K:
        return "a fused layer's widest part: groups of 32, fp16 scales"
    if fmt == "q6" and qtype == GGMLType.Q5_0:
        return "a fused layer's widest part: its values kept exactly"
    if fmt == "q5_k" and qtype == GGMLType.Q4_K:
        return "a fused layer's widest part: its values kept exactly"
    if fmt == "q8_0" and qtype in _IQ4:
        return "beside another type in a fused layer: its indices' int8 values exactly"
    if fmt == "q8_0" and qtype == GGMLType.Q2_K:
        return "beside another type in a fused layer: requantized to 8-bit groups of 32"
    if nearest_format(qtype) != fmt:
        return "requantized: a fused layer's widest part or --quantization int4"
    return _WHY[fmt]


# rows an embedding lookup unpacks at a time: a 1,000-token prompt's at once made ~25 MB of
# temporaries (fields, indices, float32 values) at a 1B's width
LOOKUP_ROWS = 128


class TiledEmbedding(nn.Module):
    """An embedding table held in a tiled format: a lookup dequantizes just the looked-up
    rows (kernels/cpu gather_rows), in the model's dtype."""

    def __init__(self, tiled: cpu_kernels.TiledWeight, dtype: torch.dtype, stored_as: str):
        super().__init__()
        self.tiled, self.dtype, self.stored_as = tiled, dtype, stored_as
        self.num_embeddings, self.embedding_dim = tiled.n, tiled.k

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        out = torch.empty(len(flat), self.embedding_dim, dtype=self.dtype)
        for i in range(0, len(flat), LOOKUP_ROWS):  # (the unpacking's temporaries stay small)
            out[i:i + LOOKUP_ROWS] = cpu_kernels.gather_rows(self.tiled, flat[i:i + LOOKUP_ROWS])
        return out.view(*ids.shape, self.embedding_dim)


def _tile(parts: list[StoredTensor], fmt: str) -> cpu_kernels.TiledWeight:
    """The parts' rows, one after another, tiled in `fmt`, converted CHUNK_ROWS at a time
    straight into the tiles (a tile holds 16 whole rows, so chunks of whole tiles tile
    apart): a 128k-row head never exists as int8 values or float32 rows all at once."""
    n, k = sum(p.rows for p in parts), parts[0].cols
    if any(p.rows % cpu_kernels.TILE for p in parts[:-1]):  # parts that share a tile
        return _tile_chunk(parts, fmt)
    out, row = None, 0
    for p in parts:
        for a in range(0, p.rows, CHUNK_ROWS):
            piece = _tile_chunk([p.slice_rows(a, min(a + CHUNK_ROWS, p.rows))], fmt).data
            if out is None:
                tiles = -(-n // cpu_kernels.TILE)
                out = torch.empty((tiles, *piece.shape[1:]), dtype=piece.dtype)
            out[row // cpu_kernels.TILE:][:len(piece)] = piece
            row += min(CHUNK_ROWS, p.rows - a)
    return cpu_kernels.TiledWeight(fmt, out, n, k)


def _tile_chunk(parts: list[StoredTensor], fmt: str) -> cpu_kernels.TiledWeight:
    if len(parts) == 1:  # the C repack where it converts the pair (REPACKS)
        repacked = cpu_kernels.repack(parts[0].raw, int(parts[0].qtype), fmt, parts[0].cols)
        if repacked is not None:
            return repacked
    if fmt == "bf16":
        return cpu_kernels.tile_bf16(torch.cat([p.dequantize().to(torch.bfloat16) for p in parts]))
    if fmt == "q4_k":  # (every part Q4_K: the narrowest format)
        fields = zip(*(q4_k_fields(p.raw, p.shape) for p in parts), strict=True)
        return cpu_kernels.tile_q4_k(*(torch.cat(column) for column in fields))
    if fmt in ("q4_0", "q5_0"):  # (every part of that type: layer_format)
        fields = zip(*(affine_groups(p.raw, p.qtype, p.shape)[:2] for p in parts), strict=True)
        tile = cpu_kernels.tile_q4_0 if fmt == "q4_0" else cpu_kernels.tile_q5_0
        return tile(*(torch.cat(column) for column in fields))
    if fmt == "q5_1":  # (every part an affine group type: layer_format)
        fields = zip(*(affine_groups(p.raw, p.qtype, p.shape) for p in parts), strict=True)
        return cpu_kernels.tile_q5_1(*(torch.cat(column) for column in fields))
    if fmt == "q5_k":  # (every part Q5_K or Q4_K: layer_format)
        fields = zip(*(q4_k_fields(p.raw, p.shape, p.qtype) for p in parts), strict=True)
        return cpu_kernels.tile_q5_k(*(torch.cat(column) for column in fields))
    if fmt == "q2_k":  # (every part Q2_K: layer_format)
        fields = zip(*(q2_k_fields(p.raw, p.shape) for p in parts), strict=True)
        return cpu_kernels.tile_q2_k(*(torch.cat(column) for column in fields))
    if fmt == "q3_k":  # (every part Q3_K: layer_format)
        fields = zip(*(q3_k_fields(p.raw, p.shape) for p in parts), strict=True)
        return cpu_kernels.tile_q3_k(*(torch.cat(column) for column in fields))
    if fmt in ("iq4_nl", "iq4_xs"):  # (every part of that type: layer_format)
        fields = zip(*(iq4_fields(p.raw, p.qtype, p.shape) for p in parts), strict=True)
        tile = cpu_kernels.tile_iq4_nl if fmt == "iq4_nl" else cpu_kernels.tile_iq4_xs
        return tile(*(torch.cat(column) for column in fields))
    if fmt == "q6_k":  # (every part Q6_K: layer_format)
        fields = zip(*(q6_k_fields(p.raw, p.shape) for p in parts), strict=True)
        return cpu_kernels.tile_q6_k(*(torch.cat(column) for column in fields))
    pieces = []
    for chunk in parts:
        if fmt == "q4_1" and chunk.qtype in _AFFINE_4BIT:
            pieces.append(affine_groups(chunk.raw, chunk.qtype, chunk.shape))
        elif fmt == "q4_1":
            pieces.append(quantize_groups(chunk.dequantize()))
        elif fmt == "q6" and chunk.qtype in _FITS_6BIT:
            pieces.append(symmetric_6bit_groups(chunk.raw, chunk.qtype, chunk.shape))
        elif fmt == "q6":
            pieces.append(quantize_6bit(chunk.dequantize()))
        elif chunk.qtype in _INT8_VALUES:
            pieces.append(symmetric_int8_groups(chunk.raw, chunk.qtype, chunk.shape))
        else:
            w = cpu_kernels.quantize_q8_0(chunk.dequantize())
            pieces.append((w.q, w.scale))
    fields = [torch.cat(column) if len(column) > 1 else column[0]
              for column in zip(*pieces, strict=True)]
    if fmt == "q4_1":
        return cpu_kernels.tile_q4_1(*fields)
    if fmt == "q6":
        return cpu_kernels.tile_q6(*fields)
    return cpu_kernels.tile_q8_0(cpu_kernels.Q8_0Weight(*fields))


def quantize_6bit(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 6-bit groups of 16 (a fused layer's part of a narrower type): q in -31..31
    (q int8 [n, k], scale float32 [n, k / 16]), the scale max|w| / 31 rounded to fp16 first
    so the values are rounded on the grid the kernels use."""
    n, k = weight.shape
    groups = weight.float().view(n, k // 16, 16)
    scale = (groups.abs().amax(-1) / 31).half().float()
    q = (groups / scale.clamp(min=1e-30)[..., None]).round().clamp(-31, 31)
    return q.to(torch.int8).view(n, k), scale


def _tile_or_wider(parts: list[StoredTensor], fmt: str) -> cpu_kernels.TiledWeight:
    """_tile, or q8_0 where q6's fp16 scales cannot hold a part's (|d * sc| over 65504)."""
    try:
        return _tile(parts, fmt)
    except cpu_kernels.ScaleOverflow as exc:
        logger.warning("%s: %s; q8_0 instead", "+".join(p.qtype.name for p in parts), exc)
        return _tile(parts, "q8_0")


def _linears(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(parent, child name, parameter path) of every nn.Linear of the model."""
    return [(module, name, f"{path}.{name}" if path else name)
            for path, module in model.named_modules()
            for name, child in module.named_children() if type(child) is nn.Linear]


def load_stored_linears_(model: nn.Module, weights: GGUFWeights, *, dtype: torch.dtype,
                         dense_weights: str = "auto", int4: bool = False) -> set[str]:
    """Replace the (meta) model's nn.Linears and its embedding by tiled layers built from the
    GGUF's blocks; returns the checkpoint names consumed (the rest load as dense tensors)."""
    by_param: dict[str, dict[str | None, str]] = defaultdict(dict)
    for hf_name in weights.names():
        name, shard = _map_hf_name(hf_name)
        if name is not None:
            by_param[name][shard] = hf_name
    tied = getattr(model.args, "tie_word_embeddings", False)
    if tied:
        by_param["lm_head.weight"] = by_param["embed_tokens.weight"]

    plan, consumed, copies = [], set(), 0
    for parent, child, path in _linears(model):
        parts = by_param.get(f"{path}.weight")
        if not parts:
            raise ValueError(f"the GGUF has no weights for {path}")
        shards = sorted(parts, key=_SHARD_ORDER.get)
        biases = by_param.get(f"{path}.bias", {})
        groups = [] if int4 else _groups_apart(weights, [parts[s] for s in shards])
        if not groups:  # one format for the whole layer
            names = [parts[s] for s in shards]
            types = {weights.stored_type(n) for n in names}
            if int4 and path != "lm_head":
                nearest = {nearest_format(t) for t in types}
                fmt = (nearest.pop() if nearest in ({"q4_k"}, {"q4_0"}, {"iq4_nl"}, {"iq4_xs"})
                       else "q4_1")
            else:
                fmt = layer_format(types)
            groups = [(names, fmt)]
        by_name = {parts[s]: biases.get(s) for s in shards}
        groups = [(names, fmt, [by_name[n] for n in names if by_name[n]]) for names, fmt in groups]
        plan.append((parent, child, path, groups))
        consumed.update(*(names + bias_names for names, _, bias_names in groups))
        copies += 2 * child_numel(parent, child)
    dense_copy = dtype == torch.bfloat16 and keep_dense_copies(dense_weights, copies)

    made: Counter = Counter()
    head_tiles = None
    for parent, child, path, groups in plan:  # one layer's bytes at a time
        layers = []
        for names, fmt, bias_names in groups:
            stored = [weights.tensor(n) for n in names]
            tiled = _tile_or_wider(stored, fmt)
            host_memory.release_freed()  # the layer's blocks: else glibc keeps ~0.6 GB at 8B
            bias = (torch.cat([weights.tensor(n).dequantize().reshape(-1) for n in bias_names])
                    if bias_names else None)
            layer = tiled_linear(tiled, bias, dtype)
            layer.wants_dense_copy = dense_copy and path != "lm_head"  # (add_dense_copies_)
            if path == "lm_head":  # many rows' logits (prompt logprobs, scoring) from exact x
                layer.int8_blockwise_above = layer.blockwise_above
            layer.stored_as = "+".join(sorted({t.qtype.name for t in stored}))
            for t in stored:
                made[(t.qtype.name, tiled.format, why(t.qtype, tiled.format))] += 1
            layers.append(layer)
        if len(layers) == 1:
            setattr(parent, child, layers[0])
        else:
            biases = [layer.bias for layer in layers]
            bias = torch.cat(biases) if all(b is not None for b in biases) else None
            setattr(parent, child, StackedLinear(layers, bias))
        if path == "lm_head":
            head_tiles = (layers[0].tiled, layers[0].stored_as)
    embed_name = by_param["embed_tokens.weight"][None]
    if tied and head_tiles is not None:
        tiles, stored_as = head_tiles
    else:
        stored = weights.tensor(embed_name)
        tiles = _tile_or_wider([stored], nearest_format(stored.qtype))
        stored_as = stored.qtype.name
    model.embed_tokens = TiledEmbedding(tiles, dtype, stored_as)
    consumed.add(embed_name)
    logger.info("weights from the GGUF as stored: %s", "; ".join(
        f"{n} {src} -> {fmt} ({reason})" for (src, fmt, reason), n in sorted(made.items())))
    return consumed


MAX_PARTS = 3  # formats in one fused layer (decode.h's MAX_PARTS)


def _groups_apart(weights: GGUFWeights, names: list[str]) -> list[tuple[list[str], str]]:
    """A fused layer's parts (names in row order) in runs of one format each, where they take
    different formats (a Q4_K_M's Q4_K q/k beside its Q6_K v; an IQ4_XS file's q/k beside Q5_K
    v): each run kept in its own, the layer a StackedLinear, instead of one format wide enough
    for all. [] where one format suits them all, or the runs cannot stand apart (more than
    MAX_PARTS, or a run that does not end on a tile's edge)."""
    runs: list[tuple[list[str], str]] = []
    for name in names:
        fmt = nearest_format(weights.stored_type(name))
        if runs and runs[-1][1] == fmt:
            runs[-1][0].append(name)
        else:
            runs.append(([name], fmt))
    if not 1 < len(runs) <= MAX_PARTS:
        return []
    rows = [sum(weights.hf_shape(n)[0] for n in run) for run, _ in runs]
    if any(r % cpu_kernels.TILE for r in rows[:-1]):
        return []
    return [(run, layer_format({weights.stored_type(n) for n in run})) for run, _ in runs]


def child_numel(parent: nn.Module, child: str) -> int:
    linear = getattr(parent, child)
    return linear.in_features * linear.out_features


def add_dense_copies_(model: nn.Module) -> None:
    """The bf16 copies load_stored_linears_ chose to keep, made once the model's own
    parameters are loaded (a copy made before `allocate_` would be emptied with them)."""
    for module in model.modules():
        if getattr(module, "wants_dense_copy", False):
            module.dense = module._dense_module(
                cpu_kernels.dequantize(module.tiled, dtype=torch.bfloat16))
            module.wants_dense_copy = False


_SHARD_ORDER = {None: 0, "q": 0, "k": 1, "v": 2, "gate": 0, "up": 1}


def weight_formats(model: nn.Module) -> dict[str, dict[str, str]]:
    """Each group of layers' stored type, tiled format and kernel (/get_server_info)."""
    groups: dict[str, dict[str, set]] = {}
    for path, module in model.named_modules():
        tiled = getattr(module, "tiled", None)
        if tiled is None or not isinstance(module, (QuantLinear, TiledEmbedding)):
            continue
        role = next(p for p in reversed(path.split(".")) if p != "parts" and not p.isdigit())
        entry = groups.setdefault(role, {"stored": set(), "format": set(), "kernel": set()})
        entry["stored"].update(getattr(module, "stored_as", "dense").split("+"))
        entry["format"].add(tiled.format)
        entry["kernel"].add(f"radixflow C {tiled.level}" if tiled.level else "torch")
    return {role: {k: "+".join(sorted(v)) for k, v in entry.items()}
            for role, entry in groups.items()}


def decode_step_bytes(model: nn.Module) -> int:
    """Weight bytes one decode step reads, once for the whole batch: each linear's tiles (or
    dense weights where it has none), the embedding's looked-up rows left out as negligible."""
    total, dense_copies = 0, set()
    for module in model.modules():
        tiled = getattr(module, "tiled", None)
        if tiled is not None and not isinstance(module, TiledEmbedding):
            total += tiled.nbytes  # its dense copy, if any, serves only many-row products
            dense_copies.update(id(m) for m in module.modules())
        elif type(module) is nn.Linear and id(module) not in dense_copies:
            total += module.weight.numel() * module.weight.element_size()
    return total
