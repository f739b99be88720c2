"""Where a benchmark's report goes: printed, and written under bench/results/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def publish(text: str, out: Path | None, raw: dict | None = None) -> None:
    """Print the markdown report; write it to `out` (None: print only), and `raw` beside it
    as JSON."""
    print(text)
    if out is None:
        return
    out.write_text(text)
    if raw is not None:
        out.with_suffix(".json").write_text(json.dumps(raw, indent=2))
    print(f"wrote {out}")


def fmt(value: Any) -> str:
    """A number as a report cell: three significant digits, or whole from 100 on; None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)
