"""Tensor parallelism (--tp-size) on tiny random models: the split, the batch plans, and an
Engine whose ranks 1.. are subprocesses, token-identical to --tp-size 1 in fp32.

Greedy identity is checked for 8 prompts x 32 tokens with prompt logprobs within 1e-4 on:
llama at TP=2 (KV heads split), qwen2 at TP=2 (q/k/v biases, tied embedding, a vocabulary
that does not divide: padded vocab shards) and qwen3 at TP=4 (q/k norms, KV heads
replicated). Streams, constraints, select and the radix cache run on TP=1 and TP=2 alike.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch
from helpers.engine_checks import settle
from helpers.tiny_models import make_tiny_model

import radixflow as rf
from radixflow.runtime.distributed.plan import FORWARD, PlanSender, receive
from radixflow.runtime.distributed.sharding import ShardSpec
from radixflow.runtime.distributed.split import check_split
from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import ServerUnavailable
from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
from radixflow.runtime.models.config import ModelArgs
from radixflow.runtime.server_args import ServerArgs

PROMPTS = ["The quick brown fox", "Once upon a time there was", "What is the capital of",
           "def add(a, b):", "Numbers: 0 1 2 3", "user: Hello! How are you",
           'Please answer in JSON: {"name"', "The cache keeps every prefix"]
GREEDY = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
ENGINE_ARGS = dict(dtype="float32", max_total_tokens=3000, max_running_requests=16,
                   chunked_prefill_size=32)


def _args(**overrides) -> ModelArgs:
    base = dict(architecture="LlamaForCausalLM", vocab_size=10, hidden_size=8, num_layers=1,
                num_heads=8, num_kv_heads=2, head_dim=4, intermediate_size=12,
                rms_norm_eps=1e-5, rope_theta=1e4, rope_scaling=None,
                max_position_embeddings=64, tie_word_embeddings=False, qkv_bias=False,
                qk_norm=False, eos_token_ids=(2,))
    return ModelArgs(**{**base, **overrides})


# ---- the split (no processes) ----


def test_kv_heads_split_or_replicated():
    a = _args()
    split = [ShardSpec.create(a, 2, r) for r in range(2)]
    assert [s.heads for s in split] == [(0, 4), (4, 4)]
    assert [s.kv_heads for s in split] == [(0, 1), (1, 1)]
    assert [s.intermediate for s in split] == [(0, 6), (6, 6)]
    assert split[0].kv_replicas == 1
    repl = [ShardSpec.create(a, 4, r) for r in range(4)]
    # each rank's 2 query heads read the KV head of their group: heads 0-3 -> 0, 4-7 -> 1
    assert [s.kv_heads for s in repl] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert repl[0].kv_replicas == 2
    assert repl[3].local_args(a).num_heads == 2 and repl[3].local_args(a).num_kv_heads == 1


def test_vocab_shards_are_padded():
    a = _args(vocab_size=10)
    specs = [ShardSpec.create(a, 4, r) for r in range(4)]
    assert [(s.vocab_start, s.vocab_rows) for s in specs] == [(0, 3), (3, 3), (6, 3), (9, 3)]
    emb = torch.arange(10.0)[:, None].repeat(1, 8)
    last = specs[3].shard("model.embed_tokens.weight", emb)
    assert last.shape == (3, 8) and last[0, 0] == 9 and not last[1:].any()
    q = torch.arange(32.0)[:, None].repeat(1, 8)  # 8 heads x head_dim 4 rows
    assert specs[1].shard("model.layers.0.self_attn.q_proj.weight", q)[:, 0].tolist() == \
        list(range(8, 16))
    o = torch.arange(32.0)[None, :].repeat(8, 1)
    assert specs[1].shard("model.layers.0.self_attn.o_proj.weight", o)[0].tolist() == \
        list(range(8, 16))
    k = torch.arange(8.0)[:, None].repeat(1, 8)  # 2 KV heads: rank 1 reads KV head 0
    assert specs[1].shard("model.layers.0.self_attn.k_proj.bias", k[:, 0]).tolist() == \
        [0, 1, 2, 3]
    norm = torch.ones(8)
    assert specs[2].shard("model.norm.weight", norm) is norm


def test_unsplittable_sizes_are_named():
    with pytest.raises(ValueError, match="its 8 attention heads.*its 2 KV heads.*"
                                         "intermediate size 10"):
        check_split(_args(intermediate_size=10), 3)
    with pytest.raises(ValueError, match="intermediate size 12"):
        check_split(_args(intermediate_size=12, num_heads=8), 8)
    check_split(_args(), 4)  # KV heads replicated


def test_server_args_checks():
    with pytest.raises(ValueError, match="--nnodes > 1 needs --dist-init-addr"):
        ServerArgs(tp_size=2, nnodes=2)
    with pytest.raises(ValueError, match="--node-rank must be in"):
        ServerArgs(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1")
    with pytest.raises(ValueError, match="cannot be spread evenly"):
        ServerArgs(tp_size=3, nnodes=2, dist_init_addr="h:1")
    with pytest.raises(ValueError, match="HOST:PORT"):
        ServerArgs(tp_size=2, dist_init_addr="nohost")
    with pytest.raises(ValueError, match="--dist-trusted-network"):
        ServerArgs(tp_size=2, dist_init_addr="10.0.0.1:5000")
    args = ServerArgs.from_cli_args(_parse("--tensor-parallel-size", "4", "--nnodes", "2",
                                           "--node-rank", "1", "--dist-init-addr",
                                           "10.0.0.1:5000", "--dist-timeout", "7",
                                           "--dist-trusted-network"))
    assert (args.tp_size, args.nnodes, args.node_rank, args.dist_init_addr,
            args.dist_timeout) == (4, 2, 1, "10.0.0.1:5000", 7.0)


def _parse(*flags):
    from radixflow.runtime.cli import build_parser

    return build_parser().parse_args(["serve", *flags])


class _Wire:
    """A fake group: rank 0's broadcasts are queued, a worker's receive them."""

    def __init__(self):
        self.sent: list[torch.Tensor] = []

    def broadcast(self, t):
        if self.sent and self.receiving:
            t.copy_(self.sent.pop(0))
        else:
            self.sent.append(t.clone())

    receiving = False


def test_plans_carry_the_table_changes_a_forward_reads():
    wire = _Wire()
    table = torch.zeros(4, 16, dtype=torch.int32)
    sender = PlanSender(wire, table)
    copy = torch.zeros_like(table)

    def roundtrip(mode, parts, slots):
        sender.send(mode, parts, slots, table)
        wire.receiving = True
        plan = receive(wire, copy)
        wire.receiving = False
        assert plan.mode == mode and plan.out_slots.tolist() == slots.tolist()
        assert [(p.req_pool_idx, p.ids, p.start_pos, p.logit_offsets) for p in plan.parts] == \
            [(p.req_pool_idx, p.ids, p.start_pos, p.logit_offsets) for p in parts]

    table[2, :5] = torch.tensor([7, 8, 9, 10, 11])
    roundtrip(ForwardMode.EXTEND, [BatchRequest(2, [5, 6, 7, 8, 9], 0, [4])],
              torch.tensor([7, 8, 9, 10, 11]))
    assert torch.equal(copy, table)
    table[2, 5] = 12
    table[3, :3] = torch.tensor([7, 8, 13])  # shares 2's first slots (the radix cache)
    before = sender.entries_sent
    roundtrip(ForwardMode.DECODE, [BatchRequest(2, [1], 5, [0]), BatchRequest(3, [4], 2, [0])],
              torch.tensor([12, 13]))
    assert sender.entries_sent - before == 4  # only what changed
    table[1, 9] = 99  # beyond any part: not sent, not read
    table[2, 0] = 3  # a row re-pointed at other slots
    table[2, 6] = 14
    roundtrip(ForwardMode.DECODE, [BatchRequest(2, [1], 6, [0])], torch.tensor([14]))
    assert copy[2, 0] == 3 and copy[1, 9] == 0
    assert sender.entries_sent == before + 4 + 2  # (0 and 6 of row 2)
    assert wire.sent == [] and FORWARD == 1


# ---- Engines: TP=2 (and TP=4) against TP=1 ----


@pytest.fixture(scope="module")
def engines(tiny_llama):
    """{1: an Engine, 2: an Engine with --tp-size 2} on the same tiny llama."""
    one = Engine(str(tiny_llama), **ENGINE_ARGS)
    two = None
    try:
        two = Engine(str(tiny_llama), tp_size=2, **ENGINE_ARGS)
        yield {1: one, 2: two}
    finally:
        one.shutdown()
        if two is not None:
            two.shutdown()


@pytest.fixture(params=[1, 2], ids=["tp1", "tp2"])
def engine(request, engines):
    return engines[request.param]


def _greedy_and_logprobs(engine) -> tuple[list[list[int]], list[list[float]]]:
    out = engine.generate(PROMPTS, GREEDY)
    lp = engine.generate(PROMPTS, {"max_new_tokens": 0}, return_logprob=True,
                         logprob_start_len=0)
    settle(engine)
    return ([r["output_ids"] for r in out],
            [[e[0] for e in r["meta_info"]["input_token_logprobs"][1:]] for r in lp])


def _assert_same(reference, tp) -> None:
    (ids_1, lps_1), (ids_n, lps_n) = reference, tp
    assert ids_n == ids_1
    assert max(abs(a - b) for x, y in zip(lps_1, lps_n) for a, b in zip(x, y)) < 1e-4


def test_llama_tp2_is_token_identical(engines):
    _assert_same(_greedy_and_logprobs(engines[1]), _greedy_and_logprobs(engines[2]))
    runner = engines[2].scheduler.runner
    assert runner.tp.size == 2 and runner.kv_pool.k[0].shape[1] == 1  # 1 of 2 KV heads
    assert runner.plan_sender.entries_sent > 0


def test_stream_matches_non_stream(engine):
    params = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    events = list(engine.generate(PROMPTS[1], params, stream=True))
    texts = [e["text"] for e in events]
    assert len(events) > 1 and all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert texts[-1] == engine.generate(PROMPTS[1], params)["text"]
    settle(engine)


def test_constraints(engine, engines):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    params = [{"regex": r"[0-9]{3}-[a-z]{2}", "max_new_tokens": 12, "temperature": 0},
              {"json_schema": json.dumps(schema), "max_new_tokens": 24, "temperature": 0}]
    outs = [engine.generate(PROMPTS[2], p)["text"] for p in params]
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", outs[0])
    if engine is engines[2]:  # the same tokens as TP=1
        assert outs == [engines[1].generate(PROMPTS[2], p)["text"] for p in params]
    settle(engine)


def test_select(engine, engines):
    @rf.function
    def pick(s):
        s += "The capital of France is " + rf.select("city", choices=["Paris", "Rome", "a b"])

    state = pick.run(backend=engine)
    if engine is engines[2]:
        other = pick.run(backend=engines[1])
        assert state["city"] == other["city"]
        assert state.scores("city") == pytest.approx(other.scores("city"), abs=1e-4)
    settle(engine)


def test_radix_cache(engine):
    system = "The cache keeps every prefix that two requests share, so the " * 3
    first = engine.generate(system + "first", GREEDY)
    second = engine.generate(system + "first", GREEDY)
    assert second["meta_info"]["cached_tokens"] >= len(engine.tokenizer(system).input_ids) - 2
    assert second["output_ids"] == first["output_ids"]
    assert engine.flush_cache()
    third = engine.generate(system + "first", GREEDY)
    assert third["meta_info"]["cached_tokens"] == 0 and third["output_ids"] == first["output_ids"]
    settle(engine)


def test_unsplittable_model_is_refused_before_any_rank_starts(tiny_llama):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"--tp-size 3 cannot split .* its 4 attention heads"):
        Engine(str(tiny_llama), tp_size=3, dtype="float32")
    assert time.monotonic() - start < 10


def _odd_vocab_qwen2(dest):
    """qwen2 (q/k/v biases) with a tied embedding of 515 rows: vocab shards of 258 rows,
    the last padded."""
    from safetensors.torch import load_file, save_file

    make_tiny_model(dest, "qwen2", tie_word_embeddings=True)
    weights = load_file(dest / "model.safetensors")
    emb = weights["model.embed_tokens.weight"]
    gen = torch.Generator().manual_seed(1)
    weights["model.embed_tokens.weight"] = torch.cat([emb, 0.15 * torch.randn(
        515 - emb.shape[0], emb.shape[1], generator=gen)])
    weights.pop("lm_head.weight", None)
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    config.update(vocab_size=515, tie_word_embeddings=True)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_qwen2_bias_tied_padded_vocab_tp2_then_a_rank_dies(tmp_path):
    model = str(_odd_vocab_qwen2(tmp_path / "qwen2-odd"))
    with Engine(model, **ENGINE_ARGS) as one:
        reference = _greedy_and_logprobs(one)
    with Engine(model, tp_size=2, **ENGINE_ARGS) as two:
        assert two.scheduler.runner.tp.spec.vocab_rows == 258
        _assert_same(reference, _greedy_and_logprobs(two))
        (worker,) = two._tp_workers.procs
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match="stopped answering"):
            two.generate(PROMPTS[0], GREEDY)
        assert time.monotonic() - start < 10


def test_qwen3_qk_norm_replicated_kv_tp4(tiny_model_factory):
    model = str(tiny_model_factory("qwen3"))
    with Engine(model, **ENGINE_ARGS) as one:
        reference = _greedy_and_logprobs(one)
    with Engine(model, tp_size=4, **ENGINE_ARGS) as four:
        assert four.scheduler.runner.tp.spec.kv_replicas == 2
        _assert_same(reference, _greedy_and_logprobs(four))


def test_int8_kv_tp2_calibrates_each_ranks_heads(tiny_llama):
    """--kv-cache-dtype int8 over two ranks: every rank runs the start-up calibration prefill
    (kv_calibration.py; its collectives matched) and centres its own KV heads' keys as one
    rank does those heads; greedy output as one rank's."""
    args = {**ENGINE_ARGS, "kv_cache_dtype": "int8"}
    with Engine(str(tiny_llama), **args) as one:
        ids_1, lps_1 = _greedy_and_logprobs(one)
        pool = one.scheduler.runner.kv_pool
        first_head = [o[:1].clone() for o in pool.k_offsets]
    with Engine(str(tiny_llama), tp_size=2, **args) as two:
        ids_2, lps_2 = _greedy_and_logprobs(two)
        rank0 = [o.clone() for o in two.scheduler.runner.kv_pool.k_offsets]
    assert all(float(o.abs().max()) > 0 for o in rank0)
    for mine, single in zip(rank0, first_head, strict=True):
        torch.testing.assert_close(mine, single, atol=1e-4, rtol=1e-4)
    assert ids_2 == ids_1
    assert max(abs(a - b) for x, y in zip(lps_1, lps_2) for a, b in zip(x, y)) < 2e-2
