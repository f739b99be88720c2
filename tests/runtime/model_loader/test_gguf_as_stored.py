"""A quantized GGUF loads from its blocks into the C kernels' tiles (runtime/models/
stored_linears.py): no weights in the prepared folder, each layer in its stored type's
format, and the same logits as the file's tensors dequantized and run dense."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import make_tiny_model, write_tiny_gguf

from radixflow.kernels import cpu as cpu_kernels
from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
from radixflow.runtime.model_loader import load_config, resolve_model
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C kernels here")


def _qtype(hf_name):
    import gguf

    if "norm" in hf_name:
        return None
    if "v_proj" in hf_name or "embed" in hf_name:
        return gguf.GGMLQuantizationType.Q8_0
    return gguf.GGMLQuantizationType.Q4_0


def _prefill_logits(folder, **args):
    runner = ModelRunner(ServerArgs(model=str(folder), max_total_tokens=256, **args), folder,
                         load_config(folder))
    ids = [1, 5, 9, 33, 70, 2, 11] * 6  # (over QUANT_MAX_ROWS: the bf16 copies' products)
    slots = runner.kv_pool.alloc(len(ids))
    runner.req_to_token_pool.req_to_token[0, :len(ids)] = slots.to(torch.int32)
    logits = runner.forward(ForwardMode.EXTEND, [BatchRequest(
        req_pool_idx=0, ids=ids, start_pos=0, logit_offsets=list(range(len(ids))))], slots)
    return runner, logits


def test_quantized_gguf_loads_as_stored(tmp_path):
    original = make_tiny_model(tmp_path / "hf", "llama")
    path = write_tiny_gguf(original, tmp_path / "q.gguf", qtype_of=_qtype)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    assert (folder / "gguf.json").is_file() and not list(folder.glob("*.safetensors"))

    runner, ours = _prefill_logits(folder, dtype="bfloat16")
    formats = runner.cpu_info()["weights"]
    assert formats["gate_up_proj"]["format"] == "q4_1"
    assert formats["gate_up_proj"]["stored"] == "Q4_0"
    assert formats["qkv_proj"]["format"] == "q8_0"  # a fused layer takes its widest part
    assert formats["embed_tokens"]["stored"] == "Q8_0"
    assert runner.cpu_info()["dense_weights"]["mode"] == "on"  # (a tiny model keeps copies)
    _, dense = _prefill_logits(folder, dtype="float32", quantization="none")
    # bf16 activations against float32: close, and the same top-1 at every position
    assert (ours - dense).abs().max() < 0.05 * dense.abs().max()
    assert torch.equal(ours.argmax(-1), dense.argmax(-1))
    forced, _ = _prefill_logits(folder, dtype="bfloat16", quantization="int4")
    assert forced.cpu_info()["weights"]["qkv_proj"]["format"] == "q4_1"
