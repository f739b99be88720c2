"""bench/dp.py without a server: its workloads and its report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench import dp  # noqa: E402


def args(**over) -> argparse.Namespace:
    base = dict(workloads=["shared_prefix", "multi_turn"], sessions=8, concurrency=4, groups=4,
                turns=2, scale=0.1, seed=0, dp_size=2, model=None)
    return argparse.Namespace(**{**base, **over})


def test_shared_prefix_groups_interleave_distinct_system_prompts():
    w = dp.build("shared_prefix", args())
    systems = [s.system for s in w.sessions]
    assert len(systems) == 8 and len(set(systems)) == 4
    assert systems[:4] == systems[4:8] and len(set(systems[:4])) == 4  # interleaved
    mt = dp.build("multi_turn", args())
    assert mt.num_requests == 16 and len({s.system for s in mt.sessions}) == 8


def test_report_renders_per_replica_split():
    rep = [{"routed_requests": 6, "cache_routed_requests": 5, "prompt_tokens": 100,
            "cache_hit_tokens": 80, "generation_tokens": 10, "hit_rate": 0.8},
           {"routed_requests": 2, "cache_routed_requests": 1, "prompt_tokens": 100,
            "cache_hit_tokens": 20, "generation_tokens": 10, "hit_rate": 0.2}]
    summary = {"output_tok_s": 10.0, "req_s": 1.0, "ttft_ms_p50": 5.0, "ttft_ms_p90": 9.0,
               "e2e_s_p50": 0.5, "errors": 0}
    run = {"summary": summary, "replicas": rep}
    text = dp.report({"cache_aware": {"shared_prefix": run, "multi_turn": run}}, args(), "1 1 1")
    assert "| cache_aware | 10 | 1 | 5 | 9 | 0.5 | 50.0% | 6 / 2 | 80.0% / 20.0% | 0 |" in text
    before = [{"routed_requests": 1, "prompt_tokens": 10, "cache_hit_tokens": 0}] * 2
    after = [{"routed_requests": 3, "prompt_tokens": 30, "cache_hit_tokens": 10}] * 2
    assert dp.deltas(before, after)[0]["hit_rate"] == 0.5
