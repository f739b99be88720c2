"""The in-process Engine and `POST /generate` of a live server answer the same body alike:
one parser, one detokenizer, one rejection mapping (only timings may differ)."""

from __future__ import annotations

import pytest
import requests
from helpers.live_server import wait_idle

from radixflow.runtime.engine import Engine
from radixflow.runtime.errors import InvalidRequest

GREEDY = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
TIMING_FIELDS = ("e2e_latency",)


@pytest.fixture(scope="module")
def engine(server, tiny_model_dir):
    with Engine(str(tiny_model_dir), max_total_tokens=server.args.max_total_tokens,
                max_running_requests=server.args.max_running_requests) as eng:
        yield eng


def untimed(response: dict) -> dict:
    meta = {k: v for k, v in response["meta_info"].items() if k not in TIMING_FIELDS}
    return {**response, "meta_info": meta}


def both(engine, server, body: dict) -> tuple[dict, dict]:
    """(Engine's answer, the server's) to `body`, each from an empty prefix cache."""
    wait_idle(server)
    assert requests.post(server.url + "/flush_cache", timeout=30).status_code == 200
    assert engine.flush_cache()
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return engine.generate_from_body(body), r.json()


def test_stop_string(engine, server):
    free = engine.generate("The quick brown fox", GREEDY)["text"]
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop.strip(), f"no stop string to pick in {free!r}"
    body = {"text": "The quick brown fox", "rid": "stop-1",
            "sampling_params": {**GREEDY, "stop": [stop]}}
    from_engine, from_server = both(engine, server, body)
    assert from_engine["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert untimed(from_engine) == untimed(from_server)


def test_first_token_with_a_leading_space(engine, server, tokenizer):
    prompts = [f"Item {i} of the list is" for i in range(64)]
    firsts = engine.generate(prompts, {**GREEDY, "max_new_tokens": 1})
    prompt = next((p for p, out in zip(prompts, firsts, strict=True)
                   if tokenizer.convert_ids_to_tokens(out["output_ids"][0]).startswith("\u0120")),
                  None)  # U+0120: a byte-level BPE token's leading space
    assert prompt is not None, "no prompt starts its output with a space-prefixed token"
    body = {"text": prompt, "rid": "space-1", "sampling_params": GREEDY,
            "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    from_engine, from_server = both(engine, server, body)
    assert from_engine["text"].startswith(" ")
    assert untimed(from_engine) == untimed(from_server)


def test_grammar_that_fails_to_compile(engine, server):
    # Valid to the pre-checks; xgrammar refuses it in the scheduler.
    body = {"text": "x", "sampling_params": {"ebnf": "root ::= undefined_rule",
                                            "max_new_tokens": 4}}
    with pytest.raises(InvalidRequest) as from_engine:
        engine.generate_from_body(body)
    r = requests.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == from_engine.value.status_code == 400
    assert r.json()["error"]["message"] == str(from_engine.value)
    assert "is not defined" in str(from_engine.value)
