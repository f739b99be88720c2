"""native_api: /generate parsing and response assembly, without a model."""

from __future__ import annotations

import json
import math

import pytest
from helpers.tiny_models import make_tiny_tokenizer

from radixflow.runtime.errors import ContextTooLong, InvalidRequest, RadixflowError, rejection
from radixflow.runtime.messages import Finish, ReqTextOut, ReqTokenOut
from radixflow.runtime.native_api import ParsedGenerate, parse_generate
from radixflow.runtime.request_building import tokenize_prompt
from radixflow.runtime.response_builder import LOGPROB_FLOOR


@pytest.fixture(scope="module")
def tok():
    return make_tiny_tokenizer()


def parse(body, tok, ctx=64):
    return parse_generate(body, tok, ctx)


FRONTEND_GEN = {
    "text": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "sampling_params": {
        "skip_special_tokens": True, "spaces_between_special_tokens": True,
        "max_new_tokens": 16, "min_new_tokens": 0, "n": 1, "stop": "\n", "stop_token_ids": [],
        "stop_regex": [], "temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "ignore_eos": False,
        "regex": None, "json_schema": None,
    },
}


def test_frontend_gen_body_parses(tok):
    p = parse(FRONTEND_GEN, tok)
    assert not p.is_batch and not p.stream and len(p.reqs) == 1
    req = p.reqs[0]
    assert req.input_ids[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert req.input_ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 1
    assert req.sampling.stop == ["\n"] and req.sampling.temperature == 0.0
    assert req.sampling.max_new_tokens == 16
    assert req.logprob_start_len == -1 and not req.return_logprob
    assert len(req.rid) == 32


def test_tokenize_prompt_adds_no_second_bos():
    class BosTok:
        bos_token_id, bos_token = 7, "<s>"

        def encode(self, text, add_special_tokens=True):
            ids = [ord(c) for c in text.replace("<s>", "\x07")]
            return [7] + ids if add_special_tokens else ids

    assert tokenize_prompt(BosTok(), "<s>ab") == [7, 97, 98]
    assert tokenize_prompt(BosTok(), "ab") == [7, 97, 98]


def test_batch_text_and_unique_rids(tok):
    p = parse({"text": ["a b", "c d", "e"], "sampling_params": {"max_new_tokens": 0}}, tok)
    assert p.is_batch and len(p.reqs) == 3
    assert len({r.rid for r in p.reqs}) == 3
    assert [r.input_ids for r in p.reqs] == [tokenize_prompt(tok, t) for t in ["a b", "c d", "e"]]
    assert p.response([{"i": 0}, {"i": 1}, {"i": 2}]) == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_n_fans_out_prompt_major(tok):
    p = parse({"text": ["x", "y"], "sampling_params": {"n": 3}}, tok)
    assert len(p.reqs) == 6 and p.is_batch
    assert [r.input_ids for r in p.reqs] == [tokenize_prompt(tok, "x")] * 3 + [
        tokenize_prompt(tok, "y")] * 3
    assert all(r.sampling.n == 1 for r in p.reqs)
    single = parse({"text": "x", "sampling_params": {"n": 2}}, tok)
    assert single.is_batch and len(single.reqs) == 2


def test_sampling_params_list_per_prompt(tok):
    p = parse({"text": ["x", "y"], "sampling_params": [{"max_new_tokens": 1},
                                                         {"max_new_tokens": 2}]}, tok)
    assert [r.sampling.max_new_tokens for r in p.reqs] == [1, 2]
    with pytest.raises(InvalidRequest, match="2 prompts"):
        parse({"text": ["x", "y"], "sampling_params": [{}]}, tok)


def test_user_rids(tok):
    p = parse({"text": "x", "rid": "abc", "sampling_params": {"n": 2}}, tok)
    assert [r.rid for r in p.reqs] == ["abc-0", "abc-1"]
    assert parse({"text": ["x", "y"], "rid": ["a", "b"]}, tok).reqs[1].rid == "b"
    with pytest.raises(InvalidRequest, match="rid"):
        parse({"text": ["x", "y"], "rid": ["a", "a"]}, tok)


def test_input_ids_single_and_batch(tok):
    p = parse({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 0}}, tok)
    assert p.reqs[0].input_ids == [5, 6, 7] and not p.is_batch
    p = parse({"input_ids": [[5, 6], [7]]}, tok)
    assert p.is_batch and [r.input_ids for r in p.reqs] == [[5, 6], [7]]


def test_logprob_start_len_semantics(tok):
    text = {"text": "a b c", "return_logprob": True}
    assert parse(text, tok).reqs[0].logprob_start_len == -1
    ids = {"input_ids": [[5, 6, 7]], "return_logprob": True}
    assert parse(ids, tok).reqs[0].logprob_start_len == 0
    assert parse({**ids, "logprob_start_len": 2}, tok).reqs[0].logprob_start_len == 2
    assert parse({**ids, "logprob_start_len": 3}, tok).reqs[0].logprob_start_len == 3
    with pytest.raises(InvalidRequest, match="greater than the prompt length"):
        parse({**ids, "logprob_start_len": 4}, tok)
    # Without return_logprob nothing is scored.
    assert parse({"input_ids": [5], "logprob_start_len": 0}, tok).reqs[0].logprob_start_len == -1


def test_max_new_tokens_clipped_to_context(tok):
    p = parse({"input_ids": [5] * 60, "sampling_params": {"max_new_tokens": 128}}, tok, ctx=64)
    assert p.reqs[0].sampling.max_new_tokens == 4
    assert parse({"input_ids": [5] * 63, "sampling_params": {"max_new_tokens": 0}}, tok,
                 ctx=64).reqs[0].sampling.max_new_tokens == 0
    with pytest.raises(ContextTooLong, match="64 tokens"):
        parse({"input_ids": [5] * 64}, tok, ctx=64)
    with pytest.raises(ContextTooLong):
        parse({"input_ids": [5] * 64, "sampling_params": {"max_new_tokens": 0}}, tok, ctx=64)


@pytest.mark.parametrize("body, param", [
    ([1, 2], None),
    ({}, "text"),
    ({"text": "a", "input_ids": [1]}, "text"),
    ({"text": ""}, "text"),
    ({"text": []}, "text"),
    ({"text": ["a", 3]}, "text"),
    ({"text": 5}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [[]]}, "input_ids"),
    ({"input_ids": [1, "2"]}, "input_ids"),
    ({"input_ids": [1, True]}, "input_ids"),
    ({"input_ids": [100000]}, "input_ids"),
    ({"input_ids": [-1]}, "input_ids"),
    ({"text": "a", "sampling_params": "hot"}, "sampling_params"),
    ({"text": "a", "sampling_params": {"temperature": "hot"}}, "temperature"),
    ({"text": "a", "sampling_params": {"bogus": 1}}, "bogus"),
    ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 10**9}}, "max_new_tokens"),
    ({"text": "a", "stream": "yes"}, "stream"),
    ({"text": "a", "return_logprob": 1}, "return_logprob"),
    ({"text": "a", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ({"text": "a", "return_logprob": True, "logprob_start_len": 1.5}, "logprob_start_len"),
    ({"text": "a", "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ({"text": "a", "return_logprob": True, "top_logprobs_num": 10**6}, "top_logprobs_num"),
    ({"text": "a", "image_data": "abc"}, "image_data"),
    ({"text": "a", "some_future_sglang_key": {"x": 1}}, "some_future_sglang_key"),
    ({"text": "a", "rid": 5}, "rid"),
])
def test_bad_bodies_raise_invalid_request(tok, body, param):
    with pytest.raises(InvalidRequest) as info:
        parse(body, tok)
    assert info.value.param == param
    assert info.value.message


def tok_out(rid, new_ids, *, completion, finish=None, logprobs=None, prompt=5, cached=0, **kw):
    return ReqTokenOut(rid=rid, new_ids=new_ids, prompt_tokens=prompt, cached_tokens=cached,
                       completion_tokens=completion, finish=finish, output_logprobs=logprobs,
                       **kw)


def test_builder_non_stream_with_input_logprobs(tok):
    body = {"input_ids": [[10, 11, 12, 13, 14]], "return_logprob": True,
            "return_text_in_logprobs": True, "logprob_start_len": 2,
            "sampling_params": {"max_new_tokens": 2}}
    p = parse(body, tok)
    (b,) = p.builders(tok)
    rid = p.reqs[0].rid
    b.add(ReqTextOut(token=tok_out(rid, [20], completion=1, logprobs=[-0.5],
                                   input_logprobs=[None, -1.0, -float("inf")], cached=2),
                     text="ab"))
    b.add(ReqTextOut(token=tok_out(rid, [21], completion=2, logprobs=[-0.25],
                                   finish=Finish(type="length", length=2), cached=2),
                     text="abc"))
    out = p.response([b.result()])
    assert isinstance(out, list) and out[0]["index"] == 0
    res = out[0]
    assert res["text"] == "abc" and res["output_ids"] == [20, 21]
    meta = res["meta_info"]
    assert meta["id"] == rid and meta["finish_reason"] == {"type": "length", "length": 2}
    assert meta["prompt_tokens"] == 5 and meta["completion_tokens"] == 2
    assert meta["cached_tokens"] == 2
    text = [tok.decode([i]) for i in (12, 13, 14)]
    assert meta["input_token_logprobs"] == [[None, 12, text[0]], [-1.0, 13, text[1]],
                                            [LOGPROB_FLOOR, 14, text[2]]]
    assert meta["output_token_logprobs"] == [[-0.5, 20, tok.decode([20])],
                                             [-0.25, 21, tok.decode([21])]]
    assert meta["output_token_logprobs_length"] == 2
    json.dumps(res, allow_nan=False)


def test_builder_stream_events_cumulative_text_delta_logprobs(tok):
    p = parse({"text": "hello", "stream": True, "return_logprob": True}, tok)
    (b,) = p.builders(tok)
    rid = p.reqs[0].rid
    b.add(ReqTextOut(token=tok_out(rid, [30], completion=1, logprobs=[-0.1]), text="A"))
    e1 = b.event()
    # Two outputs queued before the client read: they merge into one event.
    b.add(ReqTextOut(token=tok_out(rid, [31], completion=2, logprobs=[-0.2]), text="AB"))
    b.add(ReqTextOut(token=tok_out(rid, [32, 2], completion=4, logprobs=[-0.3, -0.4],
                                   finish=Finish(type="stop", matched=2)), text="ABC"))
    assert b.finished
    e2 = b.event()
    assert "index" not in e1
    assert e1["text"] == "A" and e1["meta_info"]["finish_reason"] is None
    assert e1["meta_info"]["output_token_logprobs"] == [[-0.1, 30, None]]
    assert e1["meta_info"]["output_token_logprobs_length"] == 1
    assert e2["text"] == "ABC" and e2["output_ids"] == [30, 31, 32, 2]
    assert [x[1] for x in e2["meta_info"]["output_token_logprobs"]] == [31, 32, 2]
    assert e2["meta_info"]["output_token_logprobs_length"] == 4
    assert e2["meta_info"]["completion_tokens"] == 4
    assert e2["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert e2["meta_info"]["input_token_logprobs"] == []


def test_builder_without_logprobs_has_no_logprob_keys(tok):
    p = parse({"text": "hello", "sampling_params": {"max_new_tokens": 0}}, tok)
    (b,) = p.builders(tok)
    b.add(ReqTextOut(token=tok_out(p.reqs[0].rid, [], completion=0,
                                   finish=Finish(type="length", length=0)), text=""))
    res = b.result()
    assert res["text"] == "" and res["output_ids"] == []
    assert "output_token_logprobs" not in res["meta_info"]
    assert not math.isnan(res["meta_info"]["e2e_latency"])


def test_builder_top_logprobs(tok):
    p = parse({"input_ids": [4, 5, 6], "return_logprob": True, "top_logprobs_num": 2}, tok)
    (b,) = p.builders(tok)
    b.add(ReqTextOut(token=tok_out(
        p.reqs[0].rid, [7], completion=1, logprobs=[-0.1],
        output_top_logprobs=[[(-0.1, 7), (-2.0, 8)]],
        input_logprobs=[None, -1.0, -2.0],
        input_top_logprobs=[None, [(-0.5, 9), (-1.0, 5)], [(-0.2, 3), (-2.0, 6)]],
        finish=Finish(type="length", length=1)), text="x"))
    meta = b.result()["meta_info"]
    assert meta["output_top_logprobs"] == [[[-0.1, 7, None], [-2.0, 8, None]]]
    assert meta["input_top_logprobs"][0] is None
    assert meta["input_top_logprobs"][1] == [[-0.5, 9, None], [-1.0, 5, None]]


def test_parsed_generate_single_response_is_object(tok):
    p = parse({"text": "hi"}, tok)
    assert isinstance(p, ParsedGenerate)
    assert p.response([{"text": "x"}]) == {"text": "x"}


def test_rejections_map_to_the_errors_http_gives():
    """The Engine and the server raise through this one mapping."""
    assert rejection(None) is None
    assert rejection(Finish(type="stop", matched="x").to_json()) is None
    assert rejection(Finish(type="abort", message="aborted by the client").to_json()) is None
    bad = rejection(Finish(type="abort", message="bad grammar", status_code=400).to_json())
    assert isinstance(bad, InvalidRequest) and str(bad) == "bad grammar"
    failed = rejection(Finish(type="abort", message="rejected token", status_code=500).to_json())
    assert type(failed) is RadixflowError and failed.status_code == 500
