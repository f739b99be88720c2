"""SGLang's official frontend (`sglang.RuntimeEndpoint`, `@sgl.function`) runs its programs
on `radixflow serve` as on SGLang's server: gen with regex and JSON Schema, select, fork,
run_batch sharing a prefix, streaming, a chat template. The program runs in a process of its
own (sglang_program.py): importing sglang patches transformers and sets cache variables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

PROGRAM = Path(__file__).with_name("sglang_program.py")


@pytest.fixture(scope="module")
def seen(server):
    done = subprocess.run([sys.executable, str(PROGRAM), server.url], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_constrained_gen(seen):
    assert re.fullmatch(r"\d{3}-\d{4}", seen["phone"]), seen["phone"]
    jsonschema.validate(json.loads(seen["json"]), seen["schema"])
    assert seen["json_finish"]["type"] == "stop", seen["json_finish"]


def test_select_takes_the_best_normalized_choice(seen):
    choices = [" Paris", " London", " Rome"]
    scores = seen["city_meta"]["normalized_prompt_logprobs"]
    assert len(scores) == 3
    assert seen["city"] == choices[max(range(3), key=scores.__getitem__)]


def test_fork_and_run_batch_share_the_prefix(seen):
    assert seen["branches_text"].startswith("Two ideas:\n") and "|" in seen["branches_text"]
    batch = seen["batch"]
    assert [m["completion_tokens"] for m in batch] == [3, 3, 3, 3]
    prompt = batch[0]["prompt_tokens"]
    assert prompt > 100
    assert sum(m["cached_tokens"] >= prompt - 8 for m in batch) >= 3, batch


def test_stream_pieces_are_the_whole_answer(seen):
    assert len(seen["stream_pieces"]) >= 2, seen["stream_pieces"]
    assert "".join(seen["stream_pieces"]) == seen["stream_final"] == seen["whole"]


def test_chat_template_roles(seen):
    assert [m["role"] for m in seen["chat_messages"]] == ["system", "user", "assistant"]
    assert seen["chat_text"].startswith("<|im_start|>system\nBe terse.<|im_end|>\n")
