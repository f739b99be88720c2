"""--kv-cache-dtype int8 end to end, at every CPU level this machine runs: the pool it builds
(twice the tokens of bf16 in the same --kv-cache-gb, near enough), the C decode step over it
against the torch path over the same int8 pool (the step quantizes its own K/V as the pool
does) and against a bf16 KV cache, a batch whose rows share a cached prefix, and an Engine
serving with it: sane greedy output, prefix-cache hits that reuse the int8 K/V, every slot
kept.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.c_step import teacher_forced, teacher_forced_batch

from radixflow.runtime.engine import Engine
from radixflow.runtime.forward_batch import BatchRequest, ForwardMode
from radixflow.runtime.model_runner import ModelRunner
from radixflow.runtime.server_args import ServerArgs

LEVEL = {}
TOKENS = [5, 17, 99, 3, 250, 42, 7, 300, 11, 64, 128, 2, 77, 401, 9, 18, 33, 250, 251, 6]


@pytest.fixture(autouse=True)
def _at_each_level(cpu_level):
    LEVEL.update(cpu_isa=cpu_level, dtype="bfloat16" if cpu_level == "avx512" else "float32")
    yield
    LEVEL.clear()


def _runner(folder, **args) -> ModelRunner:
    config = json.loads((folder / "config.json").read_text())
    args = {**LEVEL, "max_total_tokens": 256, **args}
    return ModelRunner(ServerArgs(model=str(folder), **args), folder, config)


def test_pool_holds_about_twice_the_tokens_in_the_same_memory(tiny_model_factory):
    folder = tiny_model_factory("llama")
    gb = dict(max_total_tokens=None, kv_cache_gb=0.01, quantization="int4")
    bf16 = _runner(folder, kv_cache_dtype="bfloat16", **gb)
    int8 = _runner(folder, kv_cache_dtype="int8", **gb)
    assert int8.kv_dtype == torch.int8 and int8.kv_pool.is_int8
    ratio = int8.kv_pool.num_slots / bf16.kv_pool.num_slots
    head_dim = int8.model_args.head_dim
    assert ratio == pytest.approx(2 * head_dim / (head_dim + 2), rel=0.01)


def test_rope_tables_cover_the_context_an_int8_pool_serves(tiny_model_factory):
    """A pool that holds fewer tokens than the model's context at bf16 but more at int8: the
    rope tables, sized before the pool, cover what the int8 pool serves."""
    from radixflow.runtime.memory_pool import KVPool

    folder = tiny_model_factory("llama")
    config = json.loads((folder / "config.json").read_text())
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_token = KVPool.bytes_per_token(config["num_hidden_layers"],
                                       config.get("num_key_value_heads", heads), head_dim,
                                       torch.bfloat16)
    context = config["max_position_embeddings"]
    runner = _runner(folder, kv_cache_dtype="int8", max_total_tokens=None,
                     kv_cache_gb=0.7 * context * per_token / 2**30, quantization="int4")
    assert runner.kv_pool.num_slots > context == runner.context_len
    assert runner.model.rope.cos.shape[0] >= context


def test_keys_are_stored_centred_and_the_calibrations_first_key_exactly(tiny_model_factory):
    """Start-up calibrates the key offsets (kv_calibration.py); a prompt that starts as the
    calibration's does (a chat request's template) stores its first key on the int8 grid,
    exactly, where later keys keep int8's error."""
    from radixflow.kernels import kv_int8
    from radixflow.runtime.kv_calibration import calibration_ids
    from radixflow.runtime.model_loader import load_tokenizer

    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8")
    pool = runner.kv_pool
    assert all(float(o.abs().max()) > 0 for o in pool.k_offsets)
    ids = calibration_ids(load_tokenizer(folder))[:16]
    slots = pool.alloc(len(ids))
    runner.req_to_token_pool.req_to_token[0, :len(ids)] = slots.to(torch.int32)
    log = pool.record_keys()
    runner.forward(ForwardMode.EXTEND, [BatchRequest(0, ids, 0, [len(ids) - 1])], slots)
    pool.stop_recording()
    for layer, (keys,) in log.items():
        stored = kv_int8.gather(pool.layer(layer)[0], slots, torch.float32)
        err = (stored + pool.k_offsets[layer] - keys).abs().amax(-1)  # [tokens, kv_heads]
        scale = keys.abs().amax(-1)
        assert bool((err[0] <= 1e-5 * scale[0]).all()), (layer, err[0])
        assert bool((err[1:] > 1e-4 * scale[1:]).any())
    pool.free(slots)


def test_calibration_leaves_no_slot_or_row_taken(tiny_model_factory):
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8")
    assert runner.kv_pool.num_free == runner.kv_pool.num_slots
    assert runner.req_to_token_pool.num_free == runner.req_to_token_pool.size


def test_c_step_over_int8_kv_matches_the_torch_path_over_it(tiny_model_factory):
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8")
    assert runner.cpu_decode is not None, "the C step reads an int8 KV cache"
    tokens = (TOKENS * 4)[:70]
    c_step = teacher_forced(runner, tokens, row=0)
    assert runner.cpu_decode.calls == len(tokens)
    runner.cpu_decode = None
    eager = teacher_forced(runner, tokens, row=1)
    scale = eager.abs().max()
    assert (c_step - eager).abs().max() < 0.05 * scale
    bf16 = _runner(folder, quantization="int4", kv_cache_dtype="bfloat16")
    bf16_step = teacher_forced(bf16, tokens, row=0)
    assert (c_step - bf16_step).abs().max() < 0.08 * scale
    agree = (c_step.argmax(-1) == bf16_step.argmax(-1)).float().mean()
    assert agree >= 0.9, agree


def test_c_step_writes_kv_as_the_pool_quantizes_it(tiny_model_factory):
    """The K/V the C step wrote: every slice's largest code is 127 (scale = amax / 127); and
    the first layer's (its inputs the same embeddings) against the pool's own write of the
    torch path's K/V for the same tokens: codes within a step or two, scales within ~1%."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8")
    pool, written = runner.kv_pool, slice(1, len(TOKENS) + 1)
    teacher_forced(runner, TOKENS, row=0)  # frees its slots; their contents stay
    for codes in (*pool.k, *pool.v):
        assert bool((codes[written].abs().amax(-1) == 127).all())
    c_codes, c_scales = pool.k[0][written].clone(), pool.k_scales[0][written].float().clone()
    runner.cpu_decode = None
    teacher_forced(runner, TOKENS, row=0)  # the same slots, written by the torch path
    torch.testing.assert_close(c_scales, pool.k_scales[0][written].float(), rtol=0.02, atol=0)
    diff = (c_codes.int() - pool.k[0][written].int()).abs()
    assert int(diff.max()) <= 2 and float(diff.float().mean()) < 0.3


def test_rows_sharing_a_prefix_over_int8_kv(tiny_model_factory):
    """A batch whose rows begin with the same slots (rf_attend_shared over int8 K/V) against
    each row alone (sharing off)."""
    folder = tiny_model_factory("llama")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8",
                     cpu_batch_int8_rows=0)
    step = runner.cpu_decode.step
    step.min_shared_prefix = 16
    prefix = (TOKENS * 3)[:40]
    slots = runner.kv_pool.alloc(len(prefix))
    table = runner.req_to_token_pool.req_to_token
    table[0, :len(prefix)] = slots.to(torch.int32)
    for i, tok in enumerate(prefix):
        runner.forward(ForwardMode.DECODE, [BatchRequest(0, [tok], i, [0])], slots[i:i + 1])
    outs = {}
    for sharing in (16, 0):
        step.min_shared_prefix = sharing
        own = runner.kv_pool.alloc(3)
        for r in range(3):
            table[r, :len(prefix)] = slots.to(torch.int32)
            table[r, len(prefix)] = int(own[r])
        parts = [BatchRequest(r, [TOKENS[r]], len(prefix), [0]) for r in range(3)]
        outs[sharing] = runner.forward(ForwardMode.DECODE, parts, own)
        runner.kv_pool.free(own)
    torch.testing.assert_close(outs[16], outs[0], atol=2e-2, rtol=2e-2)


def test_a_batch_of_requests_over_int8_kv(tiny_model_factory):
    folder = tiny_model_factory("qwen3")
    runner = _runner(folder, quantization="int4", kv_cache_dtype="int8")
    seqs = [TOKENS, TOKENS[3:15], (TOKENS * 2)[5:30]]
    batched = teacher_forced_batch(runner, seqs)
    runner.cpu_decode = None
    for seq, got in zip(seqs, batched):
        eager = teacher_forced(runner, seq, row=5)
        assert (got - eager).abs().max() < 0.06 * eager.abs().max()


def test_engine_serves_int8_kv_and_reuses_it_from_the_prefix_cache(tiny_model_factory):
    folder = tiny_model_factory("qwen3")
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    prompt = "The quick brown fox jumps over the lazy dog " * 3
    with Engine(str(folder), quantization="int4", max_total_tokens=512, kv_cache_dtype="int8",
                **LEVEL) as eng:
        runner = eng.scheduler.runner
        assert runner.kv_pool.is_int8 and runner.cpu_decode is not None
        first = eng.generate(prompt, greedy)
        again = eng.generate(prompt, greedy)  # its prompt's int8 K/V from the radix cache
        longer = eng.generate(prompt + "and more", greedy)
        batch = eng.generate([f"request {i}" for i in range(5)], greedy)
        eng.scheduler.check_slots()
    assert len(first["output_ids"]) == 8 and all(len(r["output_ids"]) == 8 for r in batch)
    assert again["output_ids"] == first["output_ids"]
    assert again["meta_info"]["cached_tokens"] > 0
    assert longer["meta_info"]["cached_tokens"] > 0


def test_soft_capped_scores_keep_keys_uncentred(tmp_path):
    """Gemma 2's tanh-capped scores would change under a shift of every key: no offsets."""
    from helpers.family_models import make_family_model

    folder, _, _ = make_family_model(tmp_path, "gemma2", tie_word_embeddings=True)
    config = json.loads((folder / "config.json").read_text())
    runner = ModelRunner(ServerArgs(model=str(folder), dtype="float32", max_total_tokens=64,
                                    kv_cache_dtype="int8", cpu_isa=LEVEL["cpu_isa"]),
                         folder, config)
    assert runner.model_args.attn_softcap is not None
    assert all(bool((o == 0).all()) for o in runner.kv_pool.k_offsets)


def test_gemma_attends_over_an_int8_pool(tmp_path):
    """Gemma's own attention (soft-capped scores: models/gemma.py) reads an int8 pool through
    the pool's layer() and rotate_queries: the prompt's logprobs close to an fp32 pool's."""
    from helpers.family_models import make_family_model

    folder, _, _ = make_family_model(tmp_path, "gemma3", tie_word_embeddings=True)
    got = {}
    for kv in ("float32", "int8"):
        with Engine(str(folder), dtype="float32", max_total_tokens=256, kv_cache_dtype=kv,
                    cpu_isa=LEVEL["cpu_isa"]) as eng:
            res = eng.generate("The cache keeps every prefix that two requests share, so the",
                               {"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                               logprob_start_len=0)
        got[kv] = torch.tensor([lp for lp, _, _ in res["meta_info"]["input_token_logprobs"][1:]])
    assert float((got["int8"] - got["float32"]).abs().max()) < 0.1
