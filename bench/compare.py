"""Side-by-side results of one workload on several servers: a ratio table and a PNG chart."""

from __future__ import annotations

import json
from pathlib import Path

from .report import fmt

# (label, summary key, higher is better)
ROWS = [
    ("output tok/s", "output_tok_s", True),
    ("requests/s", "req_s", True),
    ("TTFT p50 (ms)", "ttft_ms_p50", False),
    ("TTFT p90 (ms)", "ttft_ms_p90", False),
    ("TTFT p99 (ms)", "ttft_ms_p99", False),
    ("TPOT p50 (ms)", "tpot_ms_p50", False),
    ("e2e p50 (s)", "e2e_s_p50", False),
    ("cache hit rate", "cache_hit_rate", True),
    ("valid %", "valid_pct", True),
    ("errors", "errors", False),
]


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def ratio_table(runs: dict[str, dict]) -> str:
    """Markdown: each metric per server, and how many times better the first server is than
    each other one (its value over theirs where higher is better, theirs over its otherwise)."""
    names = list(runs)
    base = names[0]
    head = ["metric", *names, *[f"{base} vs {n}" for n in names[1:]]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, higher_is_better in ROWS:
        values = [runs[n]["summary"].get(key) for n in names]
        if all(v is None for v in values):
            continue
        ratios = [ratio(values[0], v) if higher_is_better else ratio(v, values[0])
                  for v in values[1:]]
        cells = [label, *map(fmt, values), *[("-" if r is None else f"{r:.2f}x") for r in ratios]]
        lines.append("| " + " | ".join(cells) + " |")
    first = runs[base]
    cfg = first["config"]
    title = (f"## {first['workload']}: {', '.join(names)}\n\n{cfg['requests']} requests, "
             f"concurrency {cfg['concurrency']}, seed {cfg['seed']}, scale {cfg['scale']}; "
             f"servers run one after another.\n\n")
    return title + "\n".join(lines) + "\n"


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs)
    panels = [("output tok/s (higher is better)", "output_tok_s"),
              ("TTFT p50, ms (lower is better)", "ttft_ms_p50"),
              ("TPOT p50, ms (lower is better)", "tpot_ms_p50")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (title, key) in zip(axes, panels, strict=True):
        values = [runs[n]["summary"].get(key) or 0.0 for n in names]
        bars = ax.bar(names, values, color=[f"C{i}" for i in range(len(names))])
        ax.bar_label(bars, labels=[fmt(v) for v in values], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"{runs[names[0]]['workload']} (same seeded requests on each server)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(runs: dict[str, dict], out_dir: Path) -> tuple[str, list[Path]]:
    out_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(runs.values()))
    stem = f"compare-{first['workload']}-{first['time'].replace(':', '')}"
    table = ratio_table(runs)
    md, js, png = (out_dir / f"{stem}.{ext}" for ext in ("md", "json", "png"))
    md.write_text(table + f"\n![chart]({png.name})\n")
    js.write_text(json.dumps({n: {k: r[k] for k in ("base_url", "model", "config", "summary")}
                              for n, r in runs.items()}, indent=1) + "\n")
    plot(runs, png)
    return table, [md, js, png]
