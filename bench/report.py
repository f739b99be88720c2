"""Where a benchmark's report goes: printed, and filed as one section of its study's summary.

bench/results/ keeps one markdown per study (`decode-step.md`, `peers.md`, ...): each run a
section headed by an anchor `<a id="KEY"></a>`, KEY the run's date and what set it apart
("2026-12-01-avx2-batch16"), newest first; a rerun with the same key replaces its section. The
run's raw output (JSON, per-run tables, charts) goes under bench/results/raw/, out of git.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
RAW = RESULTS / "raw"

_ANCHOR = re.compile(r'^<a id="([^"]+)"></a>\n', re.M)
_HEADING = re.compile(r"^(#{1,5}) ", re.M)
_DATE = re.compile(r"\s*[,(]?\s*\d{4}-\d{2}-\d{2}\)?")


@dataclass(frozen=True)
class Run:
    """One run of a study: the section `key` of bench/results/<study>.md."""

    study: str
    key: str

    @property
    def summary(self) -> Path:
        return RESULTS / f"{self.study}.md"

    @property
    def raw_dir(self) -> Path:
        return raw_dir(self.study)

    @property
    def chart(self) -> Path:
        """The run's picture, beside the summary: commit it where it says more than a table."""
        return RESULTS / f"{self.study}-{self.key}.png"


def raw_dir(study: str) -> Path:
    """Where a study's raw per-run output goes (ignored by git)."""
    return RAW / study


def run_key(date: str, *variant: str) -> str:
    """The date, then each non-empty variant: ("2026-12-01", "avx2", "") -> "2026-12-01-avx2"."""
    return "-".join([date, *(v.strip("-") for v in variant if v.strip("-"))])


def publish(text: str, where: Run | Path | None, raw: dict | None = None) -> None:
    """Print the markdown report; file it as `where`'s section of its study (a Path: write it
    there, for a report asked for by name; None: print only), `raw` as JSON under raw/."""
    print(text)
    if where is None:
        return
    if isinstance(where, Run):
        file_section(where.summary, where.key, text)
        if raw is not None:
            where.raw_dir.mkdir(parents=True, exist_ok=True)
            (where.raw_dir / f"{where.key}.json").write_text(json.dumps(raw, indent=2))
        print(f"wrote section {where.key} of {where.summary}")
        return
    where.write_text(text)
    if raw is not None:
        where.with_suffix(".json").write_text(json.dumps(raw, indent=2))
    print(f"wrote {where}")


def file_section(summary: Path, key: str, report: str) -> None:
    """Put `report` into `summary` as the section `key`: in its place if the key is there,
    else first (newest first); a new summary is titled after the report."""
    current = summary.read_text() if summary.exists() else study_header(report)
    head, sections = split_sections(current)
    if key in sections:
        sections[key] = section(key, report)
    else:
        sections = {key: section(key, report), **sections}
    summary.write_text(head + "".join(sections.values()))


def split_sections(text: str) -> tuple[str, dict[str, str]]:
    """A summary's text before its first section, and each section by key, in order."""
    marks = list(_ANCHOR.finditer(text))
    if not marks:
        return text, {}
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return text[:marks[0].start()], {m.group(1): text[m.start():end]
                                      for m, end in zip(marks, ends, strict=True)}


def section(key: str, report: str) -> str:
    """The report under its anchor, every heading one level down (the study's title is the
    file's only `#`); a key beyond its date names the variant in the section's title."""
    body = demote(report.strip())
    variant = key[11:]
    if variant and body.startswith("#"):
        title, _, rest = body.partition("\n")
        body = f"{title} · {variant}\n{rest}"
    return f'<a id="{key}"></a>\n\n{body}\n\n'


def demote(markdown: str) -> str:
    """Every heading outside a code fence one level down."""
    parts = re.split(r"(^```.*?^```[^\n]*$)", markdown, flags=re.M | re.S)
    return "".join(p if p.startswith("```") else _HEADING.sub(r"#\1 ", p) for p in parts)


def study_header(report: str) -> str:
    title = report.strip().partition("\n")[0].lstrip("# ")
    return (f"# {_DATE.sub('', title).strip()}\n\nOne section per run, newest first; a rerun "
            "with the same key replaces its section, its raw output under `raw/` (not in "
            "git).\n\n")


def fmt(value: Any) -> str:
    """A number as a report cell: three significant digits, or whole from 100 on; None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)
