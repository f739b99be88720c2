"""bench/agent.py at tiny sizes: the tools, the DSL workload and the /program comparison on the
shared tiny server, the chat-call emulation against the naive HF baseline app, the report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

import radixflow as rf
from bench import agent


def test_tools_and_questions():
    assert agent.calculator("12 * (3 + 4)") == "84"
    assert agent.calculator("1 / 0").startswith("error")
    assert agent.calculator("__import__('os')").startswith("error")
    assert agent.run_tool("search", "nile river").startswith("The Nile")
    assert agent.run_tool("search", "unknown words") == "no result"
    assert agent.run_tool("finish", "42") == "Answer recorded."
    assert agent.questions(6, 1) == agent.questions(6, 1) != agent.questions(6, 2)


@pytest.fixture
def short_prompts(monkeypatch):
    """The tiny tokenizer is near byte-level: keep prompts and gens short."""
    monkeypatch.setattr(agent, "SYSTEM", "You solve tasks with tools: calculator, search and "
                                         "finish. Answer in the Thought/Action/Input format.")
    monkeypatch.setattr(agent, "GEN_TOKENS", 4)
    monkeypatch.setattr(agent, "STRAIGHT_TOKENS", 3)


def test_agent_workload_and_program_comparison(server, short_prompts):
    backend = rf.Endpoint(server.url)
    run = agent.run_radixflow(backend, agent.questions(3, 0), threads=3)
    assert run["failed"] == [] and run["programs"] == 3 and len(run["latencies_s"]) == 3
    assert 0 < run["gen_tokens"] <= 3 * agent.STEPS * 2 * 4
    assert 0 < run["cache_hit_rate"] <= 1 and run["server_prompt_tokens"] > 0
    assert run["latency_p50_s"] <= run["latency_p90_s"] <= run["wall_s"]
    assert all(a in agent.ACTIONS for steps in run["actions"] for a in steps)
    straight = agent.program_vs_calls(server.url, trials=1)
    assert straight["ratio"] > 0 and len(straight["times_s"]["per_call"]) == 1


def test_chat_agent_against_hf_baseline(tiny_model_dir, short_prompts):
    from fastapi.testclient import TestClient
    from openai import OpenAI

    from bench.hf_baseline_server import Generator, create_app

    app = create_app(Generator(str(tiny_model_dir), "float32"))
    client = OpenAI(base_url="http://testserver/v1", api_key="none",
                    http_client=TestClient(app))
    latencies: list[float] = []
    gen_tokens, select_tokens = agent.chat_agent(client, "What is 2 + 2?", latencies)
    assert len(latencies) == 1
    assert 0 < gen_tokens <= agent.STEPS * 2 * 4 and 0 < select_tokens <= agent.STEPS * 4


def test_report_has_ratios_and_command():
    def run(per_s: float, **extra: float) -> dict:
        return {"wall_s": 4 / per_s, "programs_per_s": per_s, "gen_tok_per_s": 10 * per_s,
                "latency_p50_s": 1.0, "latency_p90_s": 2.0, **extra}

    raw = {"date": "2026-01-01", "machine": "x86_64, 2 CPUs", "dtype": "bfloat16",
           "device": "cpu", "system_tokens": 587,
           "cache_on": run(1.2, cache_hit_rate=0.9), "cache_off": run(0.3, cache_hit_rate=0.0),
           "hf_baseline": run(0.1, select_tokens=12),
           "program_vs_calls": {"trials": 3, "program_s": 1.0, "per_call_s": 1.5, "ratio": 1.5}}
    args = type("Args", (), {"programs": 4, "threads": 16, "trials": 3, "seed": 0})()
    text = agent.report(args, raw)
    assert "`python -m bench.agent --programs 4 --threads 16 --trials 3 --seed 0`" in text
    assert "smoke run" in text and "| 90.0% |" in text
    assert "got 4.00x" in text and "got 12.00x" in text and "= 1.50x" in text
