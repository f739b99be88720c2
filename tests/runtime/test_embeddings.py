"""Embeddings in process: the pooling read from the folder, and the scheduler prefilling embed
requests (batched, chunked, sharing prefixes) against transformers' hidden states to 1e-4."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.embedding_models import make_embedding_model, pooled, reference_hidden
from helpers.fake_runner import run_to_idle

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


def scheduler(folder, **args) -> Scheduler:
    return Scheduler.from_args(ServerArgs(model=str(folder), dtype="float32", is_embedding=True,
                                          max_total_tokens=2048, **args))


@pytest.fixture(scope="module")
def chunked(mean_folder):
    """Chunks of 16 tokens: the long inputs take several prefill steps."""
    return scheduler(mean_folder, chunked_prefill_size=16)


@pytest.fixture(scope="module")
def hidden(mean_folder):
    return reference_hidden(mean_folder, INPUTS)


def close(got: list[float], want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got), want, atol=1e-4, rtol=0)


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


def test_a_batch_of_inputs_is_one_prefill_step_and_matches_transformers(mean_folder, hidden):
    sched = scheduler(mean_folder)
    assert sched.runner.pooling.pooling == "mean" and sched.model_info()["embedding"] == {
        "pooling": "mean", "normalize": True, "hidden_size": 64}
    before = sched.num_forward_passes
    got = run_to_idle(sched, *[embed(f"r{i}", ids, "mean") for i, ids in enumerate(INPUTS)])
    assert sched.num_forward_passes - before == 1  # all four in one extend pass
    for i, h in enumerate(hidden):
        (out,) = got[f"r{i}"].outputs
        assert out.finish.to_json() == {"type": "length", "length": 0}
        assert out.new_ids == [] and out.completion_tokens == 0
        assert out.prompt_tokens == len(INPUTS[i])
        assert close(out.embedding, pooled(h, "mean")), i
    # the prompts went to the radix tree like any finished request's
    assert sched.state.tree.total_size() > 0 and sched.state.kv_pool.num_free < 2048


def test_mean_pooling_sums_every_chunk(chunked, hidden):
    before = chunked.num_forward_passes
    got = run_to_idle(chunked, embed("long", INPUTS[1], "mean"))
    assert chunked.num_forward_passes - before == 3  # 43 tokens in chunks of 16
    assert close(got["long"].outputs[-1].embedding, pooled(hidden[1], "mean"))


def test_mean_pooling_recomputes_a_cached_prefix(chunked, hidden):
    run_to_idle(chunked, embed("first", INPUTS[1], "mean"))  # PREFIX now in the tree
    got = run_to_idle(chunked, embed("second", INPUTS[2], "mean"))
    (out,) = got["second"].outputs
    assert out.cached_tokens == 0  # no hidden states in the cache: computed again
    assert close(out.embedding, pooled(hidden[2], "mean"))


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
