"""The model of a folder, built on the device in the runner's dtype with --quantization
applied: from a GGUF's blocks into radixflow's tiled kernels (stored_linears) where those run,
else from dense tensors (safetensors, or a GGUF's dequantized), quantized after loading."""

from __future__ import annotations

import logging

import torch

from radixflow.kernels import cpu as cpu_kernels
from radixflow.kernels.cpu.rows import RowKernels

from .model_loader import iter_weights
from .model_loader.gguf_tensors import GGUFWeights
from .models.config import ModelArgs
from .models.cpu_linear import can_pack, pack_linears_
from .models.llama import LlamaForCausalLM
from .models.quant_linear import can_quantize_int4, dense_weights_of, quantize_linears_
from .models.registry import model_class
from .server_args import ServerArgs

logger = logging.getLogger(__name__)


def load_model(args: ServerArgs, model_args: ModelArgs, folder, device: torch.device,
               dtype: torch.dtype, tp, context_len: int) -> tuple[LlamaForCausalLM, str]:
    """(the model, the quantization applied: "int4" (tiled layers) or "none")."""
    stored = GGUFWeights.of_folder(folder)
    if stored is not None and _loads_as_stored(args, model_args, device, tp):
        model, quantization = _load_as_stored(args, model_args, stored, dtype), "int4"
    else:
        model, quantization = _load_dense(args, model_args, folder, device, dtype, tp)
    # fp32 tables, whatever the model dtype; longrope picks its factors by the context
    model.reset_rope_tables(device, context_len=context_len)
    if device.type == "cpu" and cpu_kernels.available():
        model.bind_row_kernels(RowKernels())  # norms, rope, SiLU of extend forwards
    return model.eval(), quantization


def _loads_as_stored(args: ServerArgs, model_args: ModelArgs, device: torch.device,
                     tp) -> bool:
    """Whether a GGUF's layers go from its blocks straight into radixflow's tiled kernels
    (a CPU with them, one rank, a generation server, a dense model, --quantization auto|int4
    and no explicit --dtype float32 with auto); elsewhere its tensors load dequantized."""
    return (device.type == "cpu" and cpu_kernels.available() and tp is None
            and not args.is_embedding and args.quantization != "none"
            and model_args.num_experts == 0  # (experts: moe.py stacks dense weights)
            and not (args.quantization == "auto" and args.dtype == "float32"))


def _load_as_stored(args: ServerArgs, model_args: ModelArgs, stored: GGUFWeights,
                    dtype: torch.dtype) -> LlamaForCausalLM:
    from .models.stored_linears import add_dense_copies_, load_stored_linears_

    with torch.device("meta"):
        model = model_class(model_args)(model_args)
    consumed = load_stored_linears_(model, stored, dtype=dtype,
                                    dense_weights=args.cpu_dense_weights,
                                    int4=args.quantization == "int4")
    model.to(dtype)  # (on meta: the norms and biases left, nothing allocated yet)
    allocate_(model, torch.device("cpu"))
    model.load_weights(stored.dequantized(skip=consumed))
    add_dense_copies_(model)
    if dtype == torch.bfloat16:
        logger.info("%s", dense_weights_of(model, args.cpu_dense_weights).describe())
    return model


def _load_dense(args: ServerArgs, model_args: ModelArgs, folder, device: torch.device,
                dtype: torch.dtype, tp) -> tuple[LlamaForCausalLM, str]:
    weights = iter_weights(folder)
    with torch.device("meta"):
        if tp:
            from .distributed.tp_model import tp_model_class

            model = tp_model_class(model_args)(model_args, tp)
            weights = tp.spec.shard_weights(weights)
        else:
            model = model_class(model_args)(model_args)
    allocate_(model, device)
    model.load_weights(weights, need_lm_head=not args.is_embedding)
    quantization = _quantize(args, model, device, dtype)  # from the checkpoint's own weights
    if tp and not tp.all_agree(quantization == "int4") and quantization == "int4":
        raise ValueError("--quantization auto: this rank's shard of the weights is 4-bit "
                         "groups and another rank's is not; pass --quantization none or int4")
    model.to(dtype)
    if can_pack(device, dtype):
        pack_linears_(model)
    return model, quantization


def allocate_(model: torch.nn.Module, device: torch.device) -> None:
    """nn.Module.to_empty, without its cost: torch.empty_like from 'meta' runs torch's Python
    reference of it, which imports sympy (~0.5-1 s of every start)."""
    model._apply(lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype,
                                               device=device))


def _quantize(args: ServerArgs, model: LlamaForCausalLM, device: torch.device,
              dtype: torch.dtype) -> str:
    """Apply --quantization to dense weights; returns what was applied ("int4" or "none").

    auto: int4 on a CPU whose level has radixflow's kernels (avx512, avx2) when the
    checkpoint's weights are already 4-bit groups (a Q4_0/Q4_1 GGUF such as the default
    model's), where it is lossless and a decode step reads a third of the bytes, unless
    --dtype float32 was asked for; otherwise none.
    """
    choice = args.quantization
    if choice == "none":
        return "none"
    if not can_quantize_int4(device):
        if choice == "auto":
            return "none"
        raise ValueError("--quantization int4 needs a CPU device and torch's int4 CPU kernel")
    if choice == "auto" and (args.dtype == "float32" or not cpu_kernels.available()):
        return "none"  # (an explicit float32 asks for fp32 numerics throughout)
    count = quantize_linears_(model, keep=(model.lm_head,), only_if_exact=choice == "auto",
                              dtype=dtype, dense_weights=args.cpu_dense_weights)
    if count:
        logger.info("quantized weights for %d linear layers (--quantization %s)", count, choice)
    return "int4" if count else "none"
