"""bench/report.py: a run's report filed as one section of its study's summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench import report  # noqa: E402


def test_runs_file_newest_first_and_a_rerun_replaces_its_section(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    monkeypatch.setattr(report, "RAW", tmp_path / "raw")
    first = "# Decode step, one request, 2026-12-01\n\nCommand: `a`\n\n## Where it goes\n\n| x |"
    report.publish(first, report.Run("decode-step", "2026-12-01"), {"ms": 1.5})
    report.publish("# Decode step, 16 requests, 2026-12-02\n\nCommand: `b`",
                   report.Run("decode-step", report.run_key("2026-12-02", "avx2", "")))
    text = (tmp_path / "decode-step.md").read_text()
    assert text.startswith("# Decode step, one request\n\nOne section per run, newest first")
    assert text.index('<a id="2026-12-02-avx2"></a>') < text.index('<a id="2026-12-01"></a>')
    assert "## Decode step, 16 requests, 2026-12-02 · avx2\n" in text
    assert "## Decode step, one request, 2026-12-01\n" in text and "### Where it goes" in text
    assert json.loads((tmp_path / "raw" / "decode-step" / "2026-12-01.json").read_text()) \
        == {"ms": 1.5}

    report.publish(first.replace("`a`", "`c`"), report.Run("decode-step", "2026-12-01"))
    again = (tmp_path / "decode-step.md").read_text()
    assert again.count("<a id=") == 2 and "`c`" in again and "`a`" not in again
    assert again.index("2026-12-02-avx2") < again.index('"2026-12-01"')


def test_demote_leaves_code_fences_alone():
    text = "# T\n\n```\n# a shell comment\n```\n\n## Sub"
    assert report.demote(text) == "## T\n\n```\n# a shell comment\n```\n\n### Sub"


def test_a_path_writes_the_report_there(tmp_path):
    out = tmp_path / "x.md"
    report.publish("# X", out, {"a": 1})
    assert out.read_text() == "# X" and json.loads(out.with_suffix(".json").read_text()) == {"a": 1}
    report.publish("# Y", None)  # print only
