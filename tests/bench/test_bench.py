"""bench/: workloads, the load generator and comparison against a live server (tiny sizes),
and the naive transformers baseline server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench import loadgen, workloads
from bench.compare import write_comparison


def test_workloads_are_seeded_and_sized():
    a = workloads.build("shared_prefix", seed=3)
    b = workloads.build("shared_prefix", seed=3)
    c = workloads.build("shared_prefix", seed=4)
    assert a.num_requests == 32 and a.concurrency == 16
    assert [s.turns[0].user for s in a.sessions] == [s.turns[0].user for s in b.sessions]
    assert a.sessions[0].system != c.sessions[0].system
    assert len({s.system for s in a.sessions}) == 1  # one shared system prompt
    words = len(a.sessions[0].system.split())
    assert 650 < words * workloads.TOKENS_PER_WORD < 1150
    mt = workloads.build("multi_turn", num_sessions=2)
    assert mt.num_requests == 8 and all(len(s.turns) == 4 for s in mt.sessions)
    assert all(t.max_tokens == 16 for s in workloads.build("few_shot").sessions for t in s.turns)
    with pytest.raises(ValueError, match="unknown workload"):
        workloads.build("nope")


def test_json_extract_validator():
    v = workloads.validate_profile
    assert v('{"name": "A", "age": 3, "city": "B", "hobbies": ["x"]}') is None
    assert "schema" in v('{"name": "A", "age": "3", "city": "B", "hobbies": []}')
    assert "not JSON" in v('{"name": ')


def test_loadgen_against_live_server(server, tmp_path):
    code = loadgen.main(["--workload", "shared_prefix", "--base-url", server.url + "/v1",
                         "--num-requests", "3", "--concurrency", "2", "--scale", "0.05",
                         "--max-tokens", "4", "--out-dir", str(tmp_path)])
    assert code == 0
    (result,) = tmp_path.glob("shared_prefix-server-*.json")
    run = json.loads(result.read_text())
    s = run["summary"]
    assert run["model"] == "tiny" and s["completed"] == 3 and s["errors"] == 0
    assert s["output_tokens"] == 12 and s["output_tok_s"] > 0
    assert s["ttft_ms_p50"] > 0 and s["tpot_ms_p50"] > 0
    assert s["cached_tokens"] > 0  # the shared system prompt came from the radix cache
    assert all(r["completion_tokens"] == 4 for r in run["requests"])
    assert (tmp_path / result.name.replace(".json", ".md")).read_text().startswith("# shared")


def test_multi_turn_and_json_extract_run(server):
    for name in ("multi_turn", "json_extract"):
        wl = workloads.build(name, num_sessions=2, concurrency=2, scale=0.05, max_tokens=6)
        run = loadgen.asyncio.run(loadgen.run_workload(server.url, wl, warmup=0))
        assert run["summary"]["errors"] == 0, run["summary"]
        assert run["summary"]["completed"] == wl.num_requests
    assert run["summary"]["valid_pct"] is not None  # json_extract outputs were validated


def test_compare_writes_ratio_table_and_chart(server, tmp_path):
    wl = workloads.build("random_short", num_sessions=2, concurrency=2, scale=0.05,
                         max_tokens=3)
    runs = {name: loadgen.asyncio.run(loadgen.run_workload(server.url, wl, warmup=0))
            for name in ("first", "second")}
    table, paths = write_comparison(runs, tmp_path)
    assert "| metric | first | second | first vs second |" in table
    assert "| output tok/s |" in table and "| TTFT p99 (ms) |" in table
    png = next(p for p in paths if p.suffix == ".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_hf_baseline_server(tiny_model_dir):
    from fastapi.testclient import TestClient

    from bench.hf_baseline_server import Generator, create_app

    client = TestClient(create_app(Generator(str(tiny_model_dir), "float32")))
    assert client.get("/v1/models").json()["data"][0]["id"] == str(tiny_model_dir)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
            "temperature": 0, "ignore_eos": True}
    r = client.post("/v1/chat/completions", json=body).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"
    text = r["choices"][0]["message"]["content"]
    with client.stream("POST", "/v1/chat/completions",
                       json={**body, "stream": True,
                             "stream_options": {"include_usage": True}}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines()
                  if line.startswith("data: {")]
    streamed = "".join(c["delta"].get("content", "") for e in events for c in e["choices"])
    assert streamed == text
    assert events[-1]["usage"]["completion_tokens"] == 5
    r = client.post("/v1/completions", json={"model": "m", "prompt": "Once", "max_tokens": 3,
                                              "temperature": 0, "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 3 and isinstance(r["choices"][0]["text"], str)


def test_format_products_runs_every_format():
    from radixflow.kernels import cpu

    if not cpu.available():
        pytest.skip("no CPU kernels here")
    from bench import format_products

    results = format_products.main(["--smoke"])
    assert {r["format"] for r in results} == set(format_products.SOURCES)
    assert all(r["tiled_ms"] > 0 and r["dequant_mm_ms"] > 0 for r in results)
