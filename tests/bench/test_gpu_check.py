"""bench/gpu_check.py cannot rot between GPU sessions: its arguments parse, and its dry run's
kernel part (bench/kernels.py at smoke sizes, Triton under the interpreter) writes a report in
which every kernel agrees with its torch reference."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench import gpu_check  # noqa: E402


def test_the_arguments_parse():
    args = gpu_check.parse_args([])
    assert args.sections == list(gpu_check.SECTIONS) and not args.dry_run
    args = gpu_check.parse_args(["--dry-run", "--sections", "kernels,serve", "--budget-s", "60"])
    assert args.sections == ["kernels", "serve"] and args.dry_run and args.budget_s == 60
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--sections", "kernels,nope"])


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="the dry run is the CPU's; on a GPU bench/gpu_check.py runs for real")
def test_the_dry_runs_kernel_part_writes_a_passing_report(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    out = tmp_path / "report.md"
    assert gpu_check.main(["--dry-run", "--sections", "kernels", "--out", str(out)]) == 0
    report = out.read_text()
    assert "| Triton kernels | ok |" in report
    for kernel in ("decode attention", "extend attention", "bitmask apply", "sampling"):
        assert f"| {kernel} |" in report
    assert "FAIL" not in report
