"""Embeddings in process: the pooling read from the folder, and the scheduler prefilling embed
requests (batched, chunked, sharing prefixes) against transformers' hidden states to 1e-4; a
request that reuses a cached prefix (any pooling) pools what a run from position 0 does, to
1e-5 relative."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.embedding_models import make_embedding_model, pooled, reference_hidden
from helpers.fake_runner import collect, run_to_idle

from radixflow.runtime.messages import EmbedSpec, GenerateReq
from radixflow.runtime.model_loader.pooling import PoolingConfig, read_pooling
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler.scheduler import Scheduler
from radixflow.runtime.server_args import ServerArgs

PREFIX = list(range(40, 80))  # shared by several inputs (longer than one chunk of 16)
INPUTS = [list(range(3, 12)), PREFIX + [5, 6, 7], PREFIX + [9], [200] + PREFIX[:20]]


def embed(rid: str, ids: list[int], pooling: str, **spec) -> GenerateReq:
    return GenerateReq(rid=rid, input_ids=ids, sampling=SamplingParams(max_new_tokens=0),
                       embed=EmbedSpec(pooling=pooling, **spec))


@pytest.fixture(scope="module")
def mean_folder(tmp_path_factory):
    return make_embedding_model(tmp_path_factory.mktemp("emb-mean"), "mean")


@pytest.fixture(scope="module")
def bare_folder(tmp_path_factory):
    return make_embedding_model(tmp_path_factory.mktemp("emb-bare"), None)


P2 = list(range(90, 130))  # another shared prefix (not PREFIX's tokens), and a long tail
LONG = P2 + list(range(140, 190))


def scheduler(folder, **args) -> Scheduler:
    return Scheduler.from_args(ServerArgs(model=str(folder), dtype="float32", is_embedding=True,
                                          max_total_tokens=2048, **args))


@pytest.fixture(scope="module")
def chunked(mean_folder):
    """Chunks of 16 tokens: the long inputs take several prefill steps."""
    return scheduler(mean_folder, chunked_prefill_size=16)


@pytest.fixture(scope="module")
def scratch(mean_folder):
    """No radix cache: every input computed from position 0, in the same chunks of 16."""
    return scheduler(mean_folder, chunked_prefill_size=16, disable_radix_cache=True)


@pytest.fixture(scope="module")
def hidden(mean_folder):
    return reference_hidden(mean_folder, INPUTS)


def close(got: list[float], want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got), want, atol=1e-4, rtol=0)


def same(got: list[float], want: list[float]) -> bool:
    """Equal to 1e-5 relative (of the vector's norm): float32 rounding apart."""
    got, want = torch.tensor(got), torch.tensor(want)
    return bool((got - want).norm() <= 1e-5 * want.norm())


def from_scratch(scratch: Scheduler, ids: list[int], pooling: str) -> list[float]:
    (out,) = run_to_idle(scratch, embed("scratch", ids, pooling))["scratch"].outputs
    assert out.cached_tokens == 0
    return out.embedding


def test_pooling_is_read_from_the_folder(mean_folder, bare_folder, tmp_path):
    modules_json = str(mean_folder / "modules.json")
    assert read_pooling(mean_folder) == PoolingConfig("mean", True, modules_json)
    assert read_pooling(bare_folder) == PoolingConfig()  # last token, normalised
    cls = make_embedding_model(tmp_path / "cls", "cls", normalize=False)
    assert (read_pooling(cls).pooling, read_pooling(cls).normalize) == ("cls", False)
    modules = json.loads((cls / "modules.json").read_text())
    (cls / "modules.json").write_text(json.dumps(
        [*modules, {"idx": 3, "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ValueError, match="Dense"):
        read_pooling(cls)
    pool = cls / "1_Pooling" / "config.json"
    pool.write_text(json.dumps({"pooling_mode_max_tokens": True}))
    (cls / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        read_pooling(cls)


def test_a_batch_of_inputs_shares_its_prefix_and_matches_transformers(mean_folder, hidden):
    """One extend pass for the inputs; the one sharing PREFIX with another waits a step for
    it to be in the tree (as a generation would) and computes only its own token."""
    sched = scheduler(mean_folder)
    assert sched.runner.pooling.pooling == "mean" and sched.model_info()["embedding"] == {
        "pooling": "mean", "normalize": True, "hidden_size": 64}
    assert sched.state.hidden_sums.sums.shape == (2048 + 1, 64)
    before = sched.num_forward_passes
    got = run_to_idle(sched, *[embed(f"r{i}", ids, "mean") for i, ids in enumerate(INPUTS)])
    assert sched.num_forward_passes - before == 2  # r0, r1, r3 together; then r2
    for i, h in enumerate(hidden):
        (out,) = got[f"r{i}"].outputs
        assert out.finish.to_json() == {"type": "length", "length": 0}
        assert out.new_ids == [] and out.completion_tokens == 0
        assert out.prompt_tokens == len(INPUTS[i])
        assert out.cached_tokens == (len(PREFIX) if i == 2 else 0), i
        assert close(out.embedding, pooled(h, "mean")), i
    # the prompts went to the radix tree like any finished request's
    assert sched.state.tree.total_size() > 0 and sched.state.kv_pool.num_free < 2048


def test_mean_pooling_sums_every_chunk(chunked, hidden):
    before = chunked.num_forward_passes
    got = run_to_idle(chunked, embed("long", INPUTS[1], "mean"))
    assert chunked.num_forward_passes - before == 3  # 43 tokens in chunks of 16
    assert close(got["long"].outputs[-1].embedding, pooled(hidden[1], "mean"))


def test_mean_and_cls_pooling_reuse_a_cached_prefix(chunked, scratch, hidden):
    run_to_idle(chunked, embed("first", INPUTS[1], "mean"))  # PREFIX now in the tree
    cls_ids = PREFIX + [11, 12]
    got = run_to_idle(chunked, embed("second", INPUTS[2], "mean"),
                      embed("cls", cls_ids, "cls"))
    (second,) = got["second"].outputs
    assert second.cached_tokens == len(PREFIX)  # only its last token computed
    assert close(second.embedding, pooled(hidden[2], "mean"))
    assert same(second.embedding, from_scratch(scratch, INPUTS[2], "mean"))
    (out,) = got["cls"].outputs
    assert out.cached_tokens == len(PREFIX)
    assert close(out.embedding, pooled(hidden[1], "cls"))  # position 0: PREFIX's first
    assert same(out.embedding, from_scratch(scratch, cls_ids, "cls"))
    # the whole input cached: its last token is computed again, the vector is the same
    again = run_to_idle(chunked, embed("again", INPUTS[2], "mean"))["again"].outputs[0]
    assert again.cached_tokens == len(INPUTS[2]) - 1
    assert same(again.embedding, second.embedding)


def test_a_long_input_in_chunks_continues_a_prefix_another_pooling_cached(
        mean_folder, chunked, scratch):
    """A last-token request leaves P2 in the tree (its sums written too); a mean request of
    LONG computes its 50 other tokens in 4 chunks of 16, one sum running through them."""
    run_to_idle(chunked, embed("warm", P2 + [7], "last"))
    before = chunked.num_forward_passes
    (out,) = run_to_idle(chunked, embed("long", LONG, "mean"))["long"].outputs
    assert chunked.num_forward_passes - before == 4
    assert out.cached_tokens == len(P2)
    (want,) = reference_hidden(mean_folder, [LONG])
    assert close(out.embedding, pooled(want, "mean"))
    assert same(out.embedding, from_scratch(scratch, LONG, "mean"))
    cls = run_to_idle(chunked, embed("cls", LONG, "cls"))["cls"].outputs[0]
    assert cls.cached_tokens == len(LONG) - 1
    assert close(cls.embedding, pooled(want, "cls"))


def test_a_cls_server_keeps_sums_and_a_last_token_server_none(tmp_path, bare_folder):
    folder = make_embedding_model(tmp_path / "cls", "cls", normalize=False)
    sched = scheduler(folder, chunked_prefill_size=16)
    assert sched.state.hidden_sums is not None
    assert scheduler(bare_folder).state.hidden_sums is None  # last token: nothing to keep
    got = run_to_idle(sched, embed("a", LONG, "cls", normalize=False))
    got = run_to_idle(sched, embed("b", P2 + [5, 6], "cls", normalize=False), got=got)
    assert got["a"].outputs[0].cached_tokens == 0
    assert got["b"].outputs[0].cached_tokens == len(P2)
    (want,) = reference_hidden(folder, [LONG])
    for rid in "ab":  # both: h0 of P2's first token
        assert close(got[rid].outputs[0].embedding, pooled(want, "cls", normalize=False))
    assert same(got["b"].outputs[0].embedding, got["a"].outputs[0].embedding)


def test_a_chunk_whose_forward_failed_is_computed_again_from_the_tree(mean_folder, scratch):
    """A forward pass fails for another request of the batch: the long mean request's chunk
    is not trusted, it goes on from what the tree holds of it (its earlier chunks, their
    sums), and pools what a run without the failure does."""
    sched = scheduler(mean_folder, chunked_prefill_size=16)
    state, forward = sched.state, sched.runner.forward

    def failing(mode, parts, slots):
        doomed = state.by_rid.get("doomed")
        if doomed is not None and any(p.req_pool_idx == doomed.req_pool_idx for p in parts):
            raise RuntimeError("injected forward failure")
        return forward(mode, parts, slots)

    sched.runner.forward = failing
    got = collect(sched.step([embed("long", LONG, "mean")]), {})  # chunk 1 of 6
    got = run_to_idle(sched, embed("doomed", [3, 4, 5], "mean"), got=got)
    assert got["doomed"].finish.status_code == 500 and sched.failures.num_recoveries == 1
    (out,) = got["long"].outputs
    assert out.finish.to_json() == {"type": "length", "length": 0}
    (want,) = reference_hidden(mean_folder, [LONG])
    assert close(out.embedding, pooled(want, "mean"))
    assert same(out.embedding, from_scratch(scratch, LONG, "mean"))


def test_last_token_pooling_reuses_the_cache_and_cls_takes_the_first(chunked, hidden):
    run_to_idle(chunked, embed("a", INPUTS[1], "last"))
    got = run_to_idle(chunked, embed("b", INPUTS[2], "last"), embed("c", INPUTS[3], "cls"))
    assert got["b"].outputs[0].cached_tokens == len(PREFIX)
    assert close(got["b"].outputs[0].embedding, pooled(hidden[2], "last"))
    assert got["c"].outputs[0].cached_tokens == 0
    assert close(got["c"].outputs[0].embedding, pooled(hidden[3], "cls"))


def test_dimensions_truncate_then_renormalise_and_normalize_false(chunked, hidden):
    got = run_to_idle(chunked, embed("d", INPUTS[0], "mean", dimensions=8),
                      embed("raw", INPUTS[0], "last", normalize=False))
    vector = got["d"].outputs[0].embedding
    assert len(vector) == 8 and abs(torch.tensor(vector).norm().item() - 1) < 1e-5
    assert close(vector, pooled(hidden[0], "mean", dimensions=8))
    assert close(got["raw"].outputs[0].embedding, pooled(hidden[0], "last", normalize=False))


def test_a_generation_on_an_embedding_scheduler_is_refused(chunked, tiny_llama):
    got = run_to_idle(chunked, GenerateReq(rid="g", input_ids=[5, 6, 7],
                                           sampling=SamplingParams(max_new_tokens=4)))
    finish = got["g"].finish
    assert finish.type == "abort" and finish.status_code == 400
    assert "--is-embedding" in finish.message
    generation = Scheduler.from_args(ServerArgs(model=str(tiny_llama), dtype="float32",
                                                max_total_tokens=512))
    assert generation.model_info()["embedding"] is None
    finish = run_to_idle(generation, embed("e", [5, 6, 7], "last"))["e"].finish
    assert finish.status_code == 400 and "--is-embedding" in finish.message


def test_a_folder_without_modules_json_pools_the_last_token(bare_folder):
    """Qwen3-Embedding style: the runner resolves last-token pooling, normalised, and what it
    serves matches transformers' last hidden state of the same folder."""
    sched = scheduler(bare_folder)
    info = sched.model_info()["embedding"]
    assert (info["pooling"], info["normalize"]) == ("last", True)
    got = run_to_idle(sched, *[embed(f"r{i}", ids, info["pooling"])
                               for i, ids in enumerate(INPUTS)])
    for i, h in enumerate(reference_hidden(bare_folder, INPUTS)):
        assert close(got[f"r{i}"].outputs[0].embedding, pooled(h, "last")), i


def test_engine_encode_answers_as_encode_does(bare_folder):
    from radixflow import Engine
    from radixflow.runtime.errors import InvalidRequest

    with Engine(str(bare_folder), is_embedding=True, dtype="float32",
                max_total_tokens=1024) as engine:
        batch = engine.encode(INPUTS[:2])
        single = engine.encode(INPUTS[0], dimensions=8)
        text = engine.encode(["hello world", "hello there"])
        with pytest.raises(InvalidRequest, match="--is-embedding"):
            engine.generate("hello", {"max_new_tokens": 2})
        with pytest.raises(InvalidRequest, match="prompt must not be empty"):
            engine.encode([])
    want = reference_hidden(bare_folder, INPUTS[:2])
    assert isinstance(batch, list) and len(batch) == 2
    for got, h, ids in zip(batch, want, INPUTS, strict=False):
        assert close(got["embedding"], pooled(h, "last"))
        assert got["meta_info"]["prompt_tokens"] == len(ids)
    assert isinstance(single, dict) and len(single["embedding"]) == 8
    assert close(single["embedding"], pooled(want[0], "last", dimensions=8))
    assert len(text) == 2 and text[0]["embedding"] != text[1]["embedding"]
