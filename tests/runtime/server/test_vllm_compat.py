"""What a vLLM (or SGLang) client sends: guided_* and structured_outputs through the official
openai client's extra_body, /tokenize and /detokenize in both peers' body shapes, /version,
several served model names, --chat-template, and vLLM's flag names."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
import requests

from radixflow.runtime.cli import build_parser
from radixflow.runtime.server.process import ServerProcess
from radixflow.runtime.server_args import ServerArgs

PROMPT = "Answer: "
# Bounded, so that a random model cannot loop inside it until max_tokens.
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
GRAMMAR = 'root ::= "yes" | "no"'


def _complete(client, **extra):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body=extra)
    return r.choices[0].text


def _chat(client, **extra):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Give a number."}], max_tokens=24,
        temperature=0, extra_body=extra)
    return r.choices[0].message.content


@pytest.mark.parametrize("call", [_complete, _chat], ids=["completions", "chat"])
@pytest.mark.parametrize("extra, check", [
    ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA), "guided_decoding_backend": "xgrammar"},
     lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    ({"guided_regex": "[0-9]{3}-[a-c]"}, lambda t: re.fullmatch("[0-9]{3}-[a-c]", t)),
    ({"guided_choice": ["red", "green"]}, lambda t: t in ("red", "green")),
    ({"guided_grammar": GRAMMAR}, lambda t: t in ("yes", "no")),
    ({"structured_outputs": {"json": SCHEMA}},
     lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    ({"structured_outputs": {"regex": "[a-z]{4}"}}, lambda t: re.fullmatch("[a-z]{4}", t)),
    ({"structured_outputs": {"choice": ["up", "down"]}}, lambda t: t in ("up", "down")),
    ({"structured_outputs": {"grammar": GRAMMAR}}, lambda t: t in ("yes", "no")),
], ids=["guided_json", "guided_json_str", "guided_regex", "guided_choice", "guided_grammar",
        "so_json", "so_regex", "so_choice", "so_grammar"])
def test_vllm_constraints_hold(client, call, extra, check):
    text = call(client, **extra)
    assert check(text) is not False, text


@pytest.mark.parametrize("call", [_complete, _chat], ids=["completions", "chat"])
def test_json_object_is_response_format_json_object(client, call):
    # (A random model may not close its object within max_tokens: compare, don't parse.)
    text = call(client, structured_outputs={"json_object": True})
    assert text.startswith("{")
    assert text == call(client, response_format={"type": "json_object"})


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"regex": "a", "structured_outputs": {"json": SCHEMA}}, "structured_outputs.json"),
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_regex": "a", "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "whitespace_pattern"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_json": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "oneOf"),
])
def test_bad_constraints_are_400s_that_name_the_field(client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, **extra)
    assert param in str(err.value)


def test_logit_bias_forces_and_checks_ids(client, server):
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0,
                                  logit_bias={"70": 100}, extra_body={"ignore_eos": True})
    forced = requests.post(server.url + "/detokenize", json={"tokens": [70, 70, 70]}).json()
    assert r.choices[0].text == forced["text"]
    with pytest.raises(openai.BadRequestError, match="10000000"):
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2,
                                  logit_bias={"10000000": 5})


def test_tokenize_round_trips(server, tokenizer):
    url = server.url
    text = "The quick brown fox <|im_end|>"
    r = requests.post(f"{url}/tokenize", json={"prompt": text}).json()
    assert r["tokens"] == tokenizer.encode(text) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] > 0
    back = requests.post(f"{url}/detokenize", json={"tokens": r["tokens"],
                                                     "skip_special_tokens": False}).json()
    assert back["prompt"] == back["text"] == tokenizer.decode(r["tokens"])
    # vLLM's path and chat body; SGLang's batch shapes
    messages = [{"role": "user", "content": "hi"}]
    chat = requests.post(f"{url}/v1/tokenize", json={"model": "tiny", "messages": messages,
                                                       "return_token_strs": True}).json()
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert chat["token_strs"] == tokenizer.convert_ids_to_tokens(chat["tokens"])
    batch = requests.post(f"{url}/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert batch["count"] == [len(t) for t in batch["tokens"]] and len(batch["tokens"]) == 2
    texts = requests.post(f"{url}/detokenize", json={"tokens": batch["tokens"]}).json()["text"]
    assert texts == ["a b", "c"]


@pytest.mark.parametrize("path, body, status", [
    ("/tokenize", {}, 400),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404),
    ("/tokenize", {"prompt": "a", "bogus": 1}, 400),
    ("/detokenize", {"tokens": [10 ** 9]}, 400),
    ("/detokenize", {"tokens": "abc"}, 400),
])
def test_tokenize_errors(server, path, body, status):
    r = requests.post(server.url + path, json=body)
    assert r.status_code == status, r.text


def test_version(server):
    from radixflow.runtime.version import VERSION

    assert requests.get(server.url + "/version").json() == {"version": VERSION}


def _parse(*argv: str) -> ServerArgs:
    return ServerArgs.from_cli_args(build_parser().parse_args(["serve", *argv]))


def test_vllm_and_sglang_flag_names():
    args = _parse("some/model", "--max-model-len", "512", "--max-num-seqs", "8",
                  "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "1",
                  "--enable-prefix-caching", "--random-seed", "7",
                  "--served-model-name", "a", "b")
    assert (args.model, args.context_length, args.max_running_requests, args.mem_fraction,
            args.seed, args.served_model_names) == ("some/model", 512, 8, 0.5, 7, ["a", "b"])
    assert _parse("--model-path", "m", "--no-enable-prefix-caching").disable_radix_cache
    with pytest.raises(ValueError, match="contradicts"):
        _parse("--enable-prefix-caching", "--disable-radix-cache")
    with pytest.raises(ValueError, match="two models"):
        _parse("m1", "--model", "m2")
    assert _parse("--task", "embed").is_embedding
    assert _parse("--schedule-low-priority-values-first") == _parse()  # radixflow's rule
    assert not _parse("--task", "generate").is_embedding
    with pytest.raises(ValueError, match="--task generate contradicts --is-embedding"):
        _parse("--task", "generate", "--is-embedding")
    assert _parse("--tensor-parallel-size", "2").tp_size == 2
    with pytest.raises(ValueError, match="not a Jinja template"):
        _parse("--chat-template", "no-such-file")
    with pytest.raises(ValueError, match="does not parse"):
        _parse("--chat-template", "{% for %}")


def test_served_names_and_chat_template(tiny_model_dir, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    with ServerProcess(str(tiny_model_dir), served_model_name=["first", "second"],
                       chat_template=str(template), max_total_tokens=1024,
                       log_level="warning", start_timeout=300) as rt:
        client = openai.OpenAI(base_url=rt.url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["first", "second"]
        r = client.chat.completions.create(model="second", max_tokens=1, messages=[
            {"role": "user", "content": "hi"}])
        assert r.model == "first"
        tokens = requests.post(rt.url + "/tokenize", json={
            "messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
        text = requests.post(rt.url + "/detokenize", json={"tokens": tokens}).json()["text"]
        assert text == "<user>hi<assistant>"
        info = requests.get(rt.url + "/get_model_info").json()
        assert info["chat_template"] == template.read_text()
