"""The C decode step (kernels/cpu/decode.c via runtime/models/cpu_decode.py) against the
model it stands in for, at every CPU level this machine runs (the `cpu_level` fixture): a bf16
model at avx512, an fp32 model (with a bf16 KV cache) at avx2, as each level serves by default.

The reference is the fp32 forward of exactly the weights the model holds (its int4 layers
dequantized, its bf16 norms and embedding widened): the C step must be at least as close to it
as the eager path it replaces.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.c_step import hold_the_same_weights, teacher_forced, teacher_forced_batch

from radixflow.runtime.engine import Engine
from radixflow.runtime.forward_batch import ForwardMode
from radixflow.runtime.model_runner import BatchRequest, ModelRunner
from radixflow.runtime.server_args import ServerArgs

LEVEL = {}  # the level and dtype of the test running (set by the autouse fixture)


@pytest.fixture(autouse=True)
def _at_each_level(cpu_level):
    LEVEL.update(cpu_isa=cpu_level, dtype="bfloat16" if cpu_level == "avx512" else "float32")
    yield
    LEVEL.clear()

TOKENS = [5, 17, 99, 3, 250, 42, 7, 300, 11, 64, 128, 2, 77, 401, 9, 18, 33, 250, 251, 6]


def _reference_of(quantized: ModelRunner, folder) -> ModelRunner:
    """An fp32 runner over the weights `quantized` holds."""
    ref = _runner(folder, dtype="float32", quantization="none")
    hold_the_same_weights(quantized.model, ref.model)
    return ref


def _runner(folder, **args) -> ModelRunner:
    """A runner at the test's CPU level, in its dtype unless `args` say otherwise."""
    config = json.loads((folder / "config.json").read_text())
    args = {**LEVEL, **args}
    return ModelRunner(ServerArgs(model=str(folder), max_total_tokens=256, **args), folder, config)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "llama3_rope", "smollm2"])
def test_c_step_is_as_close_to_fp32_as_the_eager_bf16_step(tiny_model_factory, arch):
    folder = tiny_model_factory(arch)
    runner = _runner(folder, quantization="int4")
    step = runner.cpu_decode
    assert step is not None, "the C step should take a model with int4 layers"
    c_step = teacher_forced(runner, TOKENS, row=0)
    assert step.calls == len(TOKENS)
    runner.cpu_decode = None
    eager = teacher_forced(runner, TOKENS, row=1)
    exact = teacher_forced(_reference_of(runner, folder), TOKENS, row=0)

    c_err = (c_step - exact).abs().max()
    eager_err = (eager - exact).abs().max()
    assert c_err <= eager_err * 1.5 + 1e-3, (c_err, eager_err)
    # (a random tiny model's top two logits are ~0.3 apart: avx2's 8-bit activations, in the
    # eager path too, flip a few of its 20 argmaxes; the default model's figures are in
    # bench/results/quality.md)
    agree = (c_step.argmax(-1) == exact.argmax(-1)).float().mean()
    eager_agree = (eager.argmax(-1) == exact.argmax(-1)).float().mean()
    assert agree >= min(0.9, eager_agree - 0.1), (agree, eager_agree)


def test_context_beyond_one_thread_chunk_and_slots_out_of_order(tiny_model_factory):
    """Attention over many keys whose slots are not one run (as after cache reuse)."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4")
    tokens = (TOKENS * 8)[:150]
    free_first = runner.kv_pool.alloc(7)  # later slots come from after a gap
    c_step = teacher_forced(runner, tokens, row=0)
    runner.kv_pool.free(free_first)
    runner.cpu_decode = None
    eager = teacher_forced(runner, tokens, row=1)
    scale = eager.abs().max()
    assert (c_step - eager).abs().max() < 0.05 * scale


def test_it_declines_what_it_cannot_run(tiny_model_factory):
    folder = tiny_model_factory("llama")
    assert _runner(folder, dtype="float32", quantization="none").cpu_decode is None
    assert _runner(folder, quantization="none").cpu_decode is None
    assert _runner(folder, quantization="int4", disable_cpu_decode=True).cpu_decode is None


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "step by step"])
def test_engine_serves_through_it_and_keeps_every_slot(tiny_model_factory, overlap):
    folder = tiny_model_factory("qwen3")
    greedy = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    with Engine(str(folder), quantization="int4", max_total_tokens=512, **LEVEL,
                enable_overlap_schedule=overlap, disable_overlap_schedule=not overlap) as eng:
        step = eng.scheduler.runner.cpu_decode
        single = eng.generate("The quick brown fox", greedy, return_logprob=True)
        batch = eng.generate(["one", "two", "three"], greedy)  # one C step a token for all three
        many = eng.generate([f"request {i}" for i in range(20)], greedy)  # 20 rows a C step
        again = eng.generate("The quick brown fox", greedy)  # its prompt from the cache
        eng.scheduler.check_slots()
        assert step.calls >= 3 * (greedy["max_new_tokens"] - 1)
    assert len(single["output_ids"]) == 10
    assert all(len(r["output_ids"]) == 10 for r in batch + many)
    assert again["output_ids"] == single["output_ids"]
    assert again["meta_info"]["cached_tokens"] > 0


@pytest.mark.parametrize("shape", [
    dict(num_attention_heads=4, num_key_value_heads=1, head_dim=96),  # 3 chunks of 32
    dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256),  # the generic path
    # 12 query heads share one KV head
    dict(num_attention_heads=12, num_key_value_heads=1, head_dim=16, hidden_size=96),
    dict(num_attention_heads=6, num_key_value_heads=3, head_dim=48, hidden_size=96),  # a half chunk
])
def test_attention_shapes(tmp_path, shape):
    from helpers.tiny_models import make_tiny_model

    folder = make_tiny_model(tmp_path / "m", "llama", num_hidden_layers=1, **shape)
    runner = _runner(folder, quantization="int4")
    assert runner.cpu_decode is not None
    tokens = (TOKENS * 3)[:41]  # odd: a key pairs with a zero weight; blocks of 16 and a rest
    c_step = teacher_forced(runner, tokens, row=0)
    runner.cpu_decode = None
    eager = teacher_forced(runner, tokens, row=1)
    exact = teacher_forced(_reference_of(runner, folder), tokens, row=0)
    assert (c_step - exact).abs().max() <= (eager - exact).abs().max() * 1.5 + 1e-3


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_batch_of_requests_in_one_c_step(tiny_model_factory, arch):
    folder = tiny_model_factory(arch)
    runner = _runner(folder, quantization="int4")
    seqs = [TOKENS, TOKENS[3:15], (TOKENS * 2)[5:30], TOKENS[:1], TOKENS[::2]]
    calls = runner.cpu_decode.calls
    batched = teacher_forced_batch(runner, seqs)
    assert runner.cpu_decode.calls - calls == max(map(len, seqs))  # one C call a step
    ref = _reference_of(runner, folder)
    for seq, got in zip(seqs, batched):
        exact = teacher_forced(ref, seq, row=0)
        runner.cpu_decode, step = None, runner.cpu_decode
        eager = teacher_forced(runner, seq, row=7)
        runner.cpu_decode = step
        # from 3 rows the avx512 step takes x as int8 per group of 32 (gemv.h's split_mode:
        # llama.cpp's precision, and the avx2 step's at every batch), the eager path one
        # request's x exactly
        slack = 3.0 if LEVEL["cpu_isa"] == "avx512" else 1.5
        assert (got - exact).abs().max() <= (eager - exact).abs().max() * slack + 1e-3


def test_requests_sharing_a_cached_prefix(tiny_model_factory):
    """Rows whose first KV slots are the same (a prompt prefix from the radix cache) attend
    over them together: the same logits as each request alone."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", cpu_batch_int8_rows=0)  # (invariant products)
    runner.cpu_decode.step.min_shared_prefix = 16  # (a short prefix keeps the test fast)
    prefix = (TOKENS * 3)[:45]
    suffixes = [TOKENS[:9], TOKENS[4:16], TOKENS[7:10], TOKENS[::-1][:11]]
    shared = runner.kv_pool.alloc(len(prefix))
    runner.req_to_token_pool.req_to_token[0, :len(prefix)] = shared.to(torch.int32)
    for i, tok in enumerate(prefix):  # the prefix computed once, by row 0
        runner.forward(ForwardMode.DECODE, [BatchRequest(0, [tok], i, [0])], shared[i:i + 1])
    own = [runner.kv_pool.alloc(len(s)) for s in suffixes]
    for row, slots in enumerate(own):
        runner.req_to_token_pool.req_to_token[row, :len(prefix)] = shared.to(torch.int32)
        req_to_token = runner.req_to_token_pool.req_to_token
        req_to_token[row, len(prefix):len(prefix) + len(slots)] = slots.to(torch.int32)
    got: list[list[torch.Tensor]] = [[] for _ in suffixes]
    for i in range(max(map(len, suffixes))):
        live = [r for r, s in enumerate(suffixes) if i < len(s)]
        parts = [BatchRequest(r, [suffixes[r][i]], len(prefix) + i, [0]) for r in live]
        out_slots = torch.cat([own[r][i:i + 1] for r in live])
        if len(live) > 1:  # they attend over the prefix together
            lens = torch.tensor([len(prefix) + i + 1] * len(live))
            shared = runner.cpu_decode.step.shared_prefixes(
                runner.req_to_token_pool.req_to_token, torch.tensor(live), lens)
            assert shared == [len(prefix)] * len(live)
        logits = runner.forward(ForwardMode.DECODE, parts, out_slots)
        for j, r in enumerate(live):
            got[r].append(logits[j:j + 1])
    ref = _reference_of(runner, folder)
    for suffix, rows in zip(suffixes, got):
        exact = teacher_forced(ref, prefix + suffix, row=0)[len(prefix):]
        runner.cpu_decode, step = None, runner.cpu_decode
        eager = teacher_forced(runner, prefix + suffix, row=9)[len(prefix):]
        runner.cpu_decode = step
        c_step = torch.cat(rows)
        assert (c_step - exact).abs().max() <= (eager - exact).abs().max() * 1.5 + 1e-3


def test_a_step_with_several_shared_prefixes_matches_each_request_alone(tiny_model_factory):
    """One C step over rows in several groups (not adjacent in the batch, of different prefix
    lengths, some rows in none) against the same step with sharing off."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", cpu_batch_int8_rows=0)  # (invariant products)
    step = runner.cpu_decode.step
    g = torch.Generator().manual_seed(0)
    for k, v in zip(runner.kv_pool.k, runner.kv_pool.v):  # a random pool: every slot differs
        k.copy_(torch.randn(k.shape, generator=g).to(k.dtype))
        v.copy_(torch.randn(v.shape, generator=g).to(v.dtype))
    fresh = iter((torch.randperm(250, generator=g) + 1).int().split(1))

    def slots(n: int) -> torch.Tensor:
        return torch.cat([next(fresh) for _ in range(n)])

    a, b = slots(90), slots(66)
    rows = [[a, slots(5)], [b, slots(12)], [a, slots(1)], [b[:40], slots(9)],
            [a[:10], slots(20)], [a, slots(14)], [a[:80], slots(3)], [b, slots(2)]]
    table = runner.req_to_token_pool.req_to_token
    table_rows = torch.arange(len(rows)) + 2
    lens = []
    for row, pieces in zip(table_rows.tolist(), rows):
        s = torch.cat(pieces)
        table[row, :len(s)] = s
        lens.append(len(s))
    lens = torch.tensor(lens)
    assert step.shared_prefixes(table, table_rows, lens) == [80, 66, 80, 0, 0, 80, 80, 66]
    hidden, pos = runner.model.args.hidden_size, lens - 1
    x = torch.randn(len(rows), hidden, generator=g)
    cos, sin = runner.model.rope.cos.index_select(0, pos), runner.model.rope.sin[pos]
    out_slots = table[table_rows, pos].long()
    args = (x, cos, sin, out_slots, table, table_rows, lens)
    together = step(*args)
    step.min_shared_prefix = 0
    alone = step(*args)
    # the same up to bf16 weights' rounding at avx512; at avx2 up to fp32 sums' order
    assert (together - alone).abs().max() <= 0.01 * alone.abs().max()


def test_forced_rows_of_one_request_in_the_same_c_step(tiny_model_factory):
    """Jump-forward's forced tokens are rows of the decode pass with no logits wanted: the C
    step runs them with everyone else's (each sees the K/V of the rows before it) and returns
    the logits of the wanted rows only, in part order, as the torch path does."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4")
    table = runner.req_to_token_pool.req_to_token
    prompts = [TOKENS[:7], TOKENS[3:12], TOKENS[9:14]]
    forced = [[250, 251, 6], [], [42, 7]]  # request 1 decodes one sampled token only
    slots = [runner.kv_pool.alloc(len(p) + len(f)) for p, f in zip(prompts, forced)]
    for row, (prompt, s) in enumerate(zip(prompts, slots)):
        table[row, :len(s)] = s.to(torch.int32)
        runner.forward(ForwardMode.EXTEND, [BatchRequest(row, prompt[:-1], 0, [])],
                       s[:len(prompt) - 1])
    parts, out_slots = [], []
    for row, (prompt, more, s) in enumerate(zip(prompts, forced, slots)):
        ids = prompt[-1:] + more
        start = len(prompt) - 1
        for k, tok in enumerate(ids):
            parts.append(BatchRequest(row, [tok], start + k, [0] if k == len(ids) - 1 else []))
        out_slots.append(s[start:start + len(ids)])
    out_slots = torch.cat(out_slots)
    calls = runner.cpu_decode.calls
    c_step = runner.forward(ForwardMode.DECODE, parts, out_slots)
    assert runner.cpu_decode.calls == calls + 1  # one C call, no fallback
    runner.cpu_decode, step = None, runner.cpu_decode
    eager = runner.forward(ForwardMode.DECODE, parts, out_slots)
    runner.cpu_decode = step
    assert c_step.shape == eager.shape == (3, runner.vocab_size)
    assert (c_step - eager).abs().max() < 0.05 * eager.abs().max()
    assert (c_step.argmax(-1) == eager.argmax(-1)).all()


def test_a_batch_takes_int8_activations_unless_told_not_to(tiny_model_factory):
    """--cpu-batch-int8-rows: from that many rows (default 3) a step's 4-/6-bit products take x
    as int8 per group (llama.cpp's precision), so a batch's rows differ from each row alone by
    that rounding; 0 keeps them the same (up to fp32 sums' order)."""
    from radixflow.kernels import cpu as cpu_kernels

    folder = tiny_model_factory("llama")
    differences = {}
    for rows_setting in (0, 3):
        runner = _runner(folder, quantization="int4", cpu_batch_int8_rows=rows_setting)
        assert runner.cpu_info()["batch_int8_rows"] == cpu_kernels.batch_int8_rows() == rows_setting
        step = runner.cpu_decode.step
        g = torch.Generator().manual_seed(3)
        rows, lens = 6, torch.tensor([5, 9, 2, 14, 7, 3])
        table = runner.req_to_token_pool.req_to_token
        for r in range(rows):
            table[r, :int(lens[r])] = (torch.randperm(200, generator=g)[:int(lens[r])] + 1).int()
        x = torch.randn(rows, runner.model.args.hidden_size, generator=g)
        pos = lens - 1
        cos, sin = runner.model.rope.cos.index_select(0, pos), runner.model.rope.sin[pos]
        table_rows = torch.arange(rows)
        out_slots = table[table_rows, pos].long()
        together = step(x, cos, sin, out_slots, table, table_rows, lens)
        alone = torch.cat([step(x[r:r + 1], cos[r:r + 1], sin[r:r + 1], out_slots[r:r + 1], table,
                                table_rows[r:r + 1], lens[r:r + 1]) for r in range(rows)])
        differences[rows_setting] = float((together - alone).abs().max() / alone.abs().max())
    assert differences[0] <= 1e-3
    if LEVEL["cpu_isa"] == "avx512":  # (avx2 takes int8 x at every batch: alone too)
        assert 1e-3 < differences[3] < 0.05
