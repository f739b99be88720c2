"""bench/gpu_check.py's report: sections of markdown lines, each passed, failed or neither."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass


@dataclass
class Section:
    title: str
    lines: list[str]
    ok: bool | None = True  # None: nothing to pass or fail (skipped, or a measurement only)
    seconds: float = 0.0


def status(section: Section) -> str:
    return {True: "ok", False: "FAILED", None: "-"}[section.ok]


def summary(sections: list[Section]) -> str:
    return "\n".join(f"[{status(s)}] {s.title} ({s.seconds:.0f} s)" for s in sections)


def render(device_name: str, setup: list[str], sections: list[Section], seconds: float) -> str:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    lines = [
        f"# radixflow on {device_name}: the GPU check",
        "",
        (f"{datetime.datetime.now():%Y-%m-%d %H:%M}; python {platform.python_version()}, "
         f"torch {torch.__version__}, triton {triton_version}; bench/gpu_check.py took "
         f"{seconds:.0f} s."),
        "",
        "| part | result | seconds |",
        "|---|---|---:|",
        *(f"| {s.title} | {status(s)} | {s.seconds:.0f} |" for s in sections),
        "",
        "Set-up:",
        "",
        *(f"- {line}" for line in setup),
    ]
    for section in sections:
        lines += ["", f"## {section.title}", "", *section.lines]
    return "\n".join(lines) + "\n"
