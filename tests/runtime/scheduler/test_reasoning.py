"""Reasoning models (--reasoning-parser) through the in-process Engine: the parser's split, the
thinking kept apart from the answer (/generate separate_reasoning), a constraint that engages
exactly after the end-of-thinking marker, thinking_budget, and the refusals.

The tiny random model has Qwen3's real tokenizer and template (helpers/thinking_model.py);
greedy decoding with a logit_bias makes it think what the test wants, thinking_budget ends it.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import regex
from helpers.engine_checks import settle
from helpers.thinking_model import R1_TEMPLATE, make_thinking_model, render

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest
from radixflow.runtime.reasoning import (
    ANSWER,
    FORMATS,
    MAY_THINK,
    THINKING,
    ReasoningParser,
    ReasoningStream,
    check_parser_name,
)
from radixflow.runtime.server_args import ServerArgs

DIGITS = "[0-9]{3}"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "boolean"}},
          "required": ["answer"], "additionalProperties": False}
ENGINE_ARGS = dict(dtype="float32", max_total_tokens=2048, max_running_requests=8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_thinking_model(tmp_path_factory.mktemp("thinking-tiny"))


@pytest.fixture(scope="module")
def qwen3(model_dir):
    with Engine(str(model_dir), reasoning_parser="qwen3", **ENGINE_ARGS) as eng:
        yield eng


@pytest.fixture(scope="module")
def r1(model_dir):
    with Engine(str(model_dir), reasoning_parser="deepseek_r1", **ENGINE_ARGS) as eng:
        yield eng


@pytest.fixture(scope="module")
def tok(qwen3):
    return qwen3.tokenizer


@pytest.fixture(scope="module")
def ids(tok):
    """The markers, and a plain word the tests make the model think."""
    word = tok.encode(" Let", add_special_tokens=False)
    assert len(word) == 1
    start, end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    return {"start": start, "end": end, "word": word[0]}


def greedy(max_new_tokens=40, **more):
    return {"max_new_tokens": max_new_tokens, "temperature": 0, **more}


# ---- the parser alone ----

def test_parser_names_and_start_up_errors(tok):
    assert check_parser_name("deepseek_r1") == "deepseek-r1"
    with pytest.raises(ValueError, match="choices are deepseek-r1, deepseek-v3, qwen3"):
        check_parser_name("nope")
    with pytest.raises(ValueError, match="not a reasoning parser"):
        ServerArgs(reasoning_parser="nope")
    assert ServerArgs(reasoning_parser="QWEN3").reasoning_parser == "qwen3"
    help_text = next(f.metadata["help"] for f in ServerArgs.__dataclass_fields__.values()
                     if f.name == "reasoning_parser")
    assert all(name in help_text for name in FORMATS)


def test_a_tokenizer_without_marker_tokens_is_a_start_up_error(tiny_llama):
    with pytest.raises(ValueError, match="no single token for '<think>'"):
        Engine(str(tiny_llama), reasoning_parser="qwen3", **ENGINE_ARGS)


def test_the_prompt_says_where_the_output_starts(tok):
    qwen3, r1 = ReasoningParser("qwen3", tok), ReasoningParser("deepseek-r1", tok)

    def prompt_ids(**kwargs):
        return tok.encode(render(tok, "Hi", **kwargs), add_special_tokens=False)

    thinking_on, thinking_off = prompt_ids(), prompt_ids(enable_thinking=False)
    r1_prompt = prompt_ids(template=R1_TEMPLATE)
    assert render(tok, "Hi", template=R1_TEMPLATE).endswith("<think>\n")
    assert qwen3.mode(thinking_on) == MAY_THINK  # Qwen3 opens <think> itself
    assert qwen3.mode(thinking_off) == ANSWER  # the template closed it: <think>\n\n</think>\n\n
    assert qwen3.mode(r1_prompt) == THINKING
    assert r1.mode(thinking_off) == ANSWER
    assert r1.mode(r1_prompt) == r1.mode(tok.encode("no markers")) == THINKING


@pytest.mark.parametrize("mode, text, reasoning, answer", [
    (THINKING, "plan</think>\n\n42", "plan", "\n\n42"),
    (THINKING, "<think>plan</think>42", "plan", "42"),  # R1-0528 repeats the opener
    (THINKING, "cut by max_tokens", "cut by max_tokens", ""),
    (MAY_THINK, "<think>plan</think>42", "plan", "42"),
    (MAY_THINK, "42 <think>", None, "42 <think>"),  # it did not open: all answer
    (ANSWER, "<think>x</think>42", None, "<think>x</think>42"),
])
def test_split(tok, mode, text, reasoning, answer):
    parser = ReasoningParser("qwen3", tok)
    assert parser.split(text, mode, final=True) == (reasoning, answer)


@pytest.mark.parametrize("mode", [THINKING, MAY_THINK])
def test_streamed_deltas_rebuild_the_split_whatever_the_chunks(tok, mode):
    parser = ReasoningParser("qwen3", tok)
    text = "<think>a < b </thin</think>\n\nx</think>y"
    final = parser.split(text, mode, final=True)
    for size in (1, 2, 3, 5, 7):
        for hold in (False, True):
            stream, got_r, got_a = ReasoningStream(parser, mode, hold=hold), "", ""
            for k in range(size, len(text) + size, size):
                r, a = stream.update(text[:k], final=k >= len(text))
                if hold and r:  # held: the reasoning comes in one piece, then never again
                    assert not got_r and "</think>" in text[:k]
                got_r, got_a = got_r + r, got_a + a
            assert (got_r, got_a) == final


# ---- the scheduler: the grammar engages after the end marker ----

def test_r1_thinks_unconstrained_then_the_regex_holds_the_answer(r1, tok, ids):
    prompt = render(tok, "Pick a number.", template=R1_TEMPLATE)
    bias = {str(ids["word"]): 100}  # it would say " Let" forever if nothing stopped it
    res = r1.generate(prompt, greedy(regex=DIGITS, thinking_budget=6, logit_bias=bias),
                      separate_reasoning=True)
    out, meta = res["output_ids"], res["meta_info"]
    assert out[:7] == [ids["word"]] * 6 + [ids["end"]]  # the budget forced the marker
    assert meta["reasoning_text"] == " Let" * 6  # unconstrained: no digit in sight
    assert regex.fullmatch(DIGITS, res["text"])  # the grammar's first token follows </think>
    assert ids["word"] not in out[7:]
    assert meta["reasoning_tokens"] == 7 and meta["finish_reason"]["type"] == "stop"
    settle(r1)


def test_r1_thinks_from_the_first_token_even_without_the_template(r1, ids):
    res = r1.generate("Question: 1 + 1?", greedy(regex=DIGITS, thinking_budget=2,
                                                 logit_bias={str(ids["word"]): 100}),
                      separate_reasoning=True)
    assert res["output_ids"][:3] == [ids["word"], ids["word"], ids["end"]]
    assert res["meta_info"]["reasoning_text"] == " Let Let"
    assert regex.fullmatch(DIGITS, res["text"])
    settle(r1)


def test_a_json_schema_answer_validates_after_free_thinking(r1, tok, ids):
    prompt = render(tok, "JSON please.", template=R1_TEMPLATE)
    res = r1.generate(prompt, greedy(60, json_schema=json.dumps(SCHEMA), thinking_budget=5,
                                     logit_bias={str(ids["word"]): 100}),
                      separate_reasoning=True)
    assert res["meta_info"]["reasoning_text"] == " Let" * 5
    jsonschema.validate(json.loads(res["text"]), SCHEMA)
    settle(r1)


def test_a_constrained_request_cannot_end_while_it_thinks(r1, tok, ids):
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    prompt = render(tok, "Pick.", template=R1_TEMPLATE)
    res = r1.generate(prompt, greedy(regex=DIGITS, thinking_budget=4,
                                     logit_bias={str(eos): 100}),
                      separate_reasoning=True)
    out = res["output_ids"]
    assert eos not in out[:5] and out[4] == ids["end"]  # EOS was banned until </think>
    assert regex.fullmatch(DIGITS, res["text"]) and out[-1] == eos
    settle(r1)


def test_thinking_budget_zero_closes_the_thinking_at_once(r1, tok):
    res = r1.generate(render(tok, "Hi", template=R1_TEMPLATE),
                      greedy(regex=DIGITS, thinking_budget=0), separate_reasoning=True)
    assert res["meta_info"]["reasoning_text"] == "" and res["meta_info"]["reasoning_tokens"] == 1
    assert regex.fullmatch(DIGITS, res["text"])
    settle(r1)


def test_qwen3_may_open_its_thinking_beside_the_grammars_first_token(qwen3, tok, ids):
    prompt = render(tok, "Pick a number.")  # thinking on: the model opens <think> itself
    res = qwen3.generate(prompt, greedy(regex=DIGITS, thinking_budget=3,
                                        logit_bias={str(ids["start"]): 100}),
                         separate_reasoning=True)
    out = res["output_ids"]
    assert out[0] == ids["start"]  # allowed although the regex does not allow it
    assert out[1:5] == [ids["start"]] * 3 + [ids["end"]]  # it thinks "<think>"s, unconstrained
    assert res["meta_info"]["reasoning_text"] == "<think>" * 3
    assert regex.fullmatch(DIGITS, res["text"])
    settle(qwen3)


def test_with_thinking_disabled_the_output_is_the_answer(qwen3, tok, ids):
    prompt = render(tok, "Pick a number.", enable_thinking=False)
    bias = {str(ids["start"]): 100}
    res = qwen3.generate(prompt, greedy(regex=DIGITS, logit_bias=bias), separate_reasoning=True)
    assert ids["start"] not in res["output_ids"]  # the grammar held it from the first token
    assert res["meta_info"]["reasoning_text"] is None and res["meta_info"]["reasoning_tokens"] == 0
    assert regex.fullmatch(DIGITS, res["text"])
    free = qwen3.generate(prompt, greedy(8, logit_bias=bias, ignore_eos=True),
                          separate_reasoning=True)
    assert free["text"] == "<think>" * 8  # not thinking: a marker here is answer text
    assert free["meta_info"]["reasoning_text"] is None
    settle(qwen3)


def test_without_separate_reasoning_the_text_is_whole(r1, tok, ids):
    prompt = render(tok, "Hi", template=R1_TEMPLATE)
    params = greedy(regex=DIGITS, thinking_budget=2, logit_bias={str(ids["word"]): 100})
    whole = r1.generate(prompt, params)  # a budget alone still thinks first
    split = r1.generate(prompt, params, separate_reasoning=True)
    assert whole["output_ids"] == split["output_ids"]
    assert whole["text"] == " Let Let</think>" + split["text"]
    assert "reasoning_text" not in whole["meta_info"]
    settle(r1)


def test_streamed_events_grow_to_the_non_stream_result(r1, tok, ids):
    prompt = render(tok, "Hi", template=R1_TEMPLATE)
    params = greedy(regex=DIGITS, thinking_budget=5, logit_bias={str(ids["word"]): 100})
    whole = r1.generate(prompt, params, separate_reasoning=True)
    events = list(r1.generate(prompt, params, separate_reasoning=True, stream=True))
    reasonings = [e["meta_info"]["reasoning_text"] for e in events]
    texts = [e["text"] for e in events]
    for a, b in zip(reasonings, reasonings[1:]):
        assert b.startswith(a)
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)
    assert (reasonings[-1], texts[-1]) == (whole["meta_info"]["reasoning_text"], whole["text"])
    assert texts[0] == "" and reasonings[0]  # the thinking streams before any answer
    settle(r1)


def test_batches_mix_thinking_and_plain_requests(r1, tok, ids):
    prompt = render(tok, "Hi", template=R1_TEMPLATE)
    bias = {str(ids["word"]): 100}
    params = [greedy(regex=DIGITS, thinking_budget=k, logit_bias=bias) for k in (1, 3, 5)]
    outs = r1.generate([prompt] * 3, params, separate_reasoning=True)
    for k, res in zip((1, 3, 5), outs, strict=True):
        assert res["meta_info"]["reasoning_text"] == " Let" * k
        assert regex.fullmatch(DIGITS, res["text"])
    plain = r1.generate(prompt, greedy(regex=DIGITS))  # no reasoning asked: constrained at once
    assert regex.fullmatch(DIGITS, plain["text"]) and ids["end"] not in plain["output_ids"]
    settle(r1)


# ---- refusals ----

@pytest.mark.parametrize("budget", [-1, 1 << 40, "8", 2.5, True])
def test_a_bad_thinking_budget_is_refused(r1, budget):
    with pytest.raises(InvalidRequest, match="thinking_budget"):
        r1.generate("Hi", {"thinking_budget": budget}, separate_reasoning=True)


def test_separate_reasoning_must_be_a_boolean(r1):
    with pytest.raises(InvalidRequest, match="separate_reasoning must be a boolean"):
        r1.generate_from_body({"text": "Hi", "separate_reasoning": "yes"})


def test_a_server_without_a_parser_refuses_reasoning_requests(tiny_llama):
    with Engine(str(tiny_llama), **ENGINE_ARGS) as eng:
        with pytest.raises(InvalidRequest, match="separate_reasoning needs a server started "
                                                 "with --reasoning-parser"):
            eng.generate_from_body({"text": "Hi", "separate_reasoning": True})
        with pytest.raises(InvalidRequest, match="thinking_budget needs"):
            eng.generate("Hi", {"thinking_budget": 8})
        assert eng.model_info["reasoning_parser"] is None
