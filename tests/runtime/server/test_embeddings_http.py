"""/v1/embeddings and /encode on a `serve --is-embedding` of a tiny sentence-transformers model
(mean pooling + Normalize, chunks of 16 tokens), with the official openai client (float and
base64, dimensions) against sentence_transformers.SentenceTransformer to 1e-4; inputs sharing
a long prefix reuse it from the radix cache and pool what a flushed cache computes (1e-5
relative); the hostile inputs (each a 400 naming its field), and the generation endpoints
refused."""

from __future__ import annotations

import base64
import struct

import openai
import pytest
import requests
import torch
from helpers.embedding_models import make_embedding_model, pooled, reference_hidden

from radixflow.runtime.server.process import ServerProcess

SHARED = "Once upon a time there was a little robot who lived in a library. "
TEXTS = ["The quick brown fox jumps over the lazy dog.", SHARED + "It sorted the books.",
         SHARED + "What is the capital of France?", "hi"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_embedding_model(tmp_path_factory.mktemp("emb-st"), "mean")


@pytest.fixture(scope="module")
def emb_server(folder):
    rt = ServerProcess(str(folder), is_embedding=True, dtype="float32", chunked_prefill_size=16,
                       max_total_tokens=2048, served_model_name="emb", log_level="warning",
                       start_timeout=300)
    yield rt
    assert rt.shutdown() == 0


@pytest.fixture(scope="module")
def emb(emb_server):
    return openai.OpenAI(base_url=emb_server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


@pytest.fixture(scope="module")
def st_model(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module")
def expected(st_model):
    return st_model.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS)).float()


def close(got, want) -> bool:
    return torch.allclose(torch.tensor(list(got), dtype=torch.float32), want, atol=1e-4, rtol=0)


def test_float_and_base64_match_sentence_transformers(emb, expected, folder):
    floats = emb.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
    assert floats.object == "list" and floats.model == "emb"
    assert [d.index for d in floats.data] == [0, 1, 2, 3]
    for d, want in zip(floats.data, expected, strict=True):
        assert len(d.embedding) == 64 and close(d.embedding, want)
    # the client's default asks for base64 and decodes it (little-endian float32)
    b64 = emb.embeddings.create(model="emb", input=TEXTS)
    for d, want in zip(b64.data, expected, strict=True):
        assert close(d.embedding, want)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    counts = [len(tok(t)["input_ids"]) for t in TEXTS]
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(counts)


def test_token_inputs_and_dimensions(emb, emb_server, folder):
    ids = [[5, 6, 7, 8, 9, 10] * 5, [40, 41, 42]]  # the first spans two chunks of 16
    want = [pooled(h, "mean", dimensions=16) for h in reference_hidden(folder, ids)]
    got = emb.embeddings.create(model="emb", input=ids, dimensions=16, encoding_format="float")
    for d, w in zip(got.data, want, strict=True):
        assert len(d.embedding) == 16 and close(d.embedding, w)
    one = emb.embeddings.create(model="emb", input=ids[1], dimensions=16)  # [int]: one input
    assert len(one.data) == 1 and close(one.data[0].embedding, want[1])
    raw = requests.post(emb_server.url + "/v1/embeddings", timeout=30, json={
        "model": "emb", "input": ids[1], "dimensions": 16, "encoding_format": "base64",
        "user": "u1"}).json()
    data = base64.b64decode(raw["data"][0]["embedding"])
    assert close(struct.unpack("<16f", data), want[1])


def test_encode_shapes(emb_server, expected):
    one = requests.post(emb_server.url + "/encode", json={"text": TEXTS[0]}, timeout=30).json()
    assert close(one["embedding"], expected[0])
    assert one["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    assert one["meta_info"]["prompt_tokens"] > 0 and one["meta_info"]["id"]
    many = requests.post(emb_server.url + "/encode", json={"text": TEXTS[1:3]}, timeout=30).json()
    assert isinstance(many, list) and len(many) == 2
    for out, want in zip(many, expected[1:3], strict=True):
        assert close(out["embedding"], want)
    # the same input again: all but its last token from the radix cache, the same vector
    again = requests.post(emb_server.url + "/encode", json={"text": TEXTS[2]}, timeout=30).json()
    meta = again["meta_info"]
    assert meta["cached_tokens"] == meta["prompt_tokens"] - 1
    assert close(again["embedding"], expected[2])
    ids = requests.post(emb_server.url + "/encode", json={"input_ids": [[5, 6], [7, 8]]},
                        timeout=30).json()
    assert len(ids) == 2 and len(ids[0]["embedding"]) == 64


def test_a_shared_prefix_is_reused_and_pools_as_a_flushed_cache_does(emb_server, st_model):
    """Mean pooling over a prefix another input left in the radix cache: only the rest is
    computed (in chunks of 16), from the hidden-state sums the cache keeps by KV slot."""
    texts = [SHARED * 3 + "Then it slept.", SHARED * 3 + "Then it read a book about whales, "
             "one about the stars and a third about the sea, until the lamps went out."]
    want = st_model.encode(texts, convert_to_tensor=True).float()

    def encode(text: str) -> dict:
        r = requests.post(emb_server.url + "/encode", json={"text": text}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    encode(texts[0])
    second = encode(texts[1])
    prompt_tokens = second["meta_info"]["prompt_tokens"]
    cached = second["meta_info"]["cached_tokens"]
    assert cached > 40 and prompt_tokens - cached > 16  # the rest: more than one chunk
    assert close(second["embedding"], want[1])
    flushed = requests.post(emb_server.url + "/flush_cache", timeout=30)
    assert flushed.status_code == 200, flushed.text
    again = encode(texts[1])
    assert again["meta_info"]["cached_tokens"] == 0
    got, scratch = torch.tensor(second["embedding"]), torch.tensor(again["embedding"])
    assert (got - scratch).norm() <= 1e-5 * scratch.norm()


HOSTILE = [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["fine", ""]}, "input[1]"),
    ({"input": [[]]}, "input[0]"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [5] * 600}, "input"),  # the context is 512 tokens
    ({"input": [[1, 10 ** 9]]}, "input[0]"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": 65}, "dimensions"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "extra": 1}, "extra"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": ["a", 1]}, "input"),
]


@pytest.mark.parametrize(("body", "param"), HOSTILE)
def test_hostile_inputs_are_400s_naming_the_field(emb_server, body, param):
    r = requests.post(emb_server.url + "/v1/embeddings", json={"model": "emb", **body},
                      timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] is not None and error["param"].startswith(param), error
    if body.get("input") == ["x"] * 2049:
        assert "2048" in error["message"]
    if param == "dimensions" and body["dimensions"] == 65:
        assert "64" in error["message"]


def test_bad_encode_bodies_and_wrong_model(emb_server, emb):
    url = emb_server.url
    for body in ({"text": "a", "input_ids": [1]}, {}, {"text": "a", "image_data": "x"},
                 {"text": ""}, {"input_ids": [[]]}):
        assert requests.post(url + "/encode", json=body, timeout=30).status_code == 400, body
    with pytest.raises(openai.NotFoundError):
        emb.embeddings.create(model="nope", input="a")
    assert requests.get(url + "/health", timeout=5).status_code == 200


def test_generation_endpoints_name_the_flag(emb_server, emb):
    r = requests.post(emb_server.url + "/generate", json={"text": "hi"}, timeout=30)
    assert r.status_code == 400 and "--is-embedding" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="--is-embedding"):
        emb.chat.completions.create(model="emb", messages=[{"role": "user", "content": "hi"}],
                                    max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="--is-embedding"):
        emb.completions.create(model="emb", prompt="hi", max_tokens=4)
    assert emb.embeddings.create(model="emb", input="still serving").data  # alive


def test_a_generation_server_refuses_embeddings(server, client):
    """The shared tiny server (no --is-embedding)."""
    with pytest.raises(openai.BadRequestError, match="--is-embedding"):
        client.embeddings.create(model="tiny", input="hi")
    r = requests.post(server.url + "/encode", json={"text": "hi"}, timeout=30)
    assert r.status_code == 400 and "--is-embedding" in r.json()["error"]["message"]


def test_health_generate_and_model_info_know_an_embedding_server(emb_server, server):
    assert requests.get(emb_server.url + "/health_generate", timeout=60).status_code == 200
    info = requests.get(emb_server.url + "/get_model_info", timeout=30).json()
    assert info["is_generation"] is False and info["embedding"]["pooling"] == "mean"
    assert requests.get(server.url + "/get_model_info", timeout=30).json()["is_generation"]
