"""GET /tokenizer_info in the shape lm-evaluation-harness's RemoteTokenizer reads
(lm_eval/utils.py: eos_token, bos_token, pad_token, chat_template; then /tokenize and
/detokenize for the ids)."""

from __future__ import annotations

import json

import requests


def test_tokenizer_info_has_what_lm_eval_reads(server, tokenizer):
    info = requests.get(server.url + "/tokenizer_info", timeout=30).json()
    for key in ("eos_token", "bos_token", "pad_token", "chat_template"):
        assert key in info
    assert info["eos_token"] == tokenizer.eos_token and info["eos_token"]
    assert info["bos_token"] == tokenizer.bos_token
    assert info["chat_template"] == tokenizer.chat_template and "{%" in info["chat_template"]
    assert info["eos_token_id"] == tokenizer.eos_token_id
    assert info["model_max_length"] == 4096 and info["vocab_size"] == len(tokenizer)


def test_lm_evals_remote_tokenizer_round_trip(server, tokenizer):
    # RemoteTokenizer.eos_token_id: the eos text through /tokenize without special tokens
    eos = requests.get(server.url + "/tokenizer_info", timeout=30).json()["eos_token"]
    r = requests.post(server.url + "/tokenize", timeout=30,
                      data=json.dumps({"prompt": eos, "add_special_tokens": False}),
                      headers={"Content-Type": "application/json"})
    assert r.json()["tokens"][0] == tokenizer.eos_token_id
    r = requests.post(server.url + "/detokenize", timeout=30,
                      data=json.dumps({"tokens": tokenizer.encode("hello world",
                                                                  add_special_tokens=False)}),
                      headers={"Content-Type": "application/json"})
    assert r.json()["prompt"] == "hello world"
