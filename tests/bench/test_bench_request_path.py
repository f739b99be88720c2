"""bench/request_path.py's counting, on a temp folder standing in for the repository (the
measurement itself starts the default model's server: `python -m bench.request_path`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the root holds bench/

from bench import request_path  # noqa: E402


def test_counts_library_files_once_over_processes(tmp_path):
    for rel, lines in (("runtime/a.py", 3), ("runtime/server/b.py", 5), ("lang/c.py", 2),
                       ("tests/t.py", 7), ("bench/x.py", 1), ("runtime/notes.txt", 4)):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * lines)
    outside = tmp_path.parent / "site-packages-stand-in.py"
    outside.write_text("y = 2\n")
    f = {rel: str(tmp_path / rel) for rel in ("runtime/a.py", "runtime/server/b.py", "lang/c.py",
                                               "tests/t.py", "bench/x.py", "runtime/notes.txt")}
    dumps = [{"pid": 1, "name": "MainProcess", "argv": ["radixflow", "serve"],
              "called": [f["runtime/a.py"], f["tests/t.py"], str(outside), "<frozen os>"],
              "stacked": [f["lang/c.py"]]},
             {"pid": 2, "name": "scheduler", "argv": ["-c"],
              "called": [f["runtime/a.py"], f["runtime/server/b.py"], f["bench/x.py"],
                         f["runtime/notes.txt"]], "stacked": []},
             {"pid": 3, "name": "MainProcess", "argv": ["-c"], "called": [], "stacked": []}]
    result = request_path.count(dumps, root=tmp_path)
    assert result.files == {"runtime/a.py": 3, "runtime/server/b.py": 5, "lang/c.py": 2}
    assert result.lines == 10 and result.only_running == {"lang/c.py"}
    assert result.per_process == {"HTTP (1)": 2, "scheduler (2)": 2, "-c (3)": 0}
    assert result.by_folder() == {"lang": ["c.py"], "runtime": ["a.py"],
                                  "runtime/server": ["b.py"]}
