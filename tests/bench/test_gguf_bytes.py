"""bench.gguf_bytes: what a decode step reads of a GGUF (one embedding row, the routed share of
stacked experts, everything else once, K/V per context token)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench.gguf_bytes import bytes_per_token  # noqa: E402


def test_a_moe_file_reads_its_routed_experts_only(tmp_path):
    import gguf

    path = tmp_path / "tiny-moe.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    f32 = np.float32
    w.add_tensor("token_embd.weight", np.zeros((10, 8), f32))  # 10 rows of 32 bytes
    w.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), f32))
    w.add_tensor("blk.0.ffn_gate_inp.weight", np.zeros((4, 8), f32))
    w.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((4, 16, 8), f32))
    w.add_tensor("output.weight", np.zeros((10, 8), f32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = bytes_per_token(path)
    assert got.parts == {"embedding row": 32, "attention": 256, "router + shared expert": 128,
                         "routed experts": 4 * 16 * 8 * 4 * 2 // 4, "head": 320}
    assert got.held == 320 + 256 + 128 + 2048 + 320
    assert got.kv_per_token == 1 * 2 * 1 * 4 * 2  # layers, K and V, kv heads, head_dim, fp16
    assert got.total(context=3) == sum(got.parts.values()) + 3 * got.kv_per_token
