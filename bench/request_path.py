"""How many project files one json_schema chat request passes through, over every process.

Starts a real `radixflow serve` (default model unless --model) with bench/request_path_hook.py
as its sitecustomize, so that each of its processes (HTTP, scheduler, detokenizer) records the
file of every Python call while a shared control byte is on. After start-up and one warm-up
request (a json_schema chat with another schema), it turns recording on, sends ONE
/v1/chat/completions request with a small object schema in `response_format`, waits for the
server to settle, turns recording off and collects each process's files. Counted: the Python
files of the library (lang/, runtime/, radix_cache/, kernels/), with their lines; not the C
kernels, the tests, the benchmarks or third-party code.

    python -m bench.request_path             # prints, and adds today's section to
                                             # bench/results/request-path.md
    python -m bench.request_path --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from .report import Run, publish

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("lang", "runtime", "radix_cache", "kernels")
HOOK = Path(__file__).with_name("request_path_hook.py")
WARM_UP_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                  "required": ["ok"]}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
OFF, ON, DUMP = 0, 1, 2


@dataclass(frozen=True)
class PathCount:
    """The library files a request passed through: relative path -> lines; those it reached
    only as frames already running when recording began (the processes' loops); how many
    files each process passed through."""

    files: dict[str, int]
    only_running: set[str]
    per_process: dict[str, int]

    @property
    def lines(self) -> int:
        return sum(self.files.values())

    def by_folder(self) -> dict[str, list[str]]:
        folders: dict[str, list[str]] = {}
        for rel in sorted(self.files):
            folders.setdefault(str(Path(rel).parent), []).append(Path(rel).name)
        return folders


def library_files(paths: Iterable[str], root: Path = ROOT) -> dict[str, int]:
    """The paths that are the library's Python files under `root`, relative, with their lines."""
    found: dict[str, int] = {}
    for p in paths:
        path = Path(p)
        if path.suffix != ".py" or not path.is_absolute() or not path.is_file():
            continue
        try:
            rel = path.resolve().relative_to(root.resolve())
        except ValueError:
            continue
        if rel.parts[0] in LIBRARY:
            with path.open("rb") as f:
                found[str(rel)] = sum(1 for _ in f)
    return found


def count(dumps: list[dict], root: Path = ROOT) -> PathCount:
    """The union over the processes (a file seen in two processes counts once)."""
    called: dict[str, int] = {}
    union: dict[str, int] = {}
    per_process: dict[str, int] = {}
    for d in dumps:
        in_calls = library_files(d["called"], root)
        files = {**library_files(d["stacked"], root), **in_calls}
        called.update(in_calls)
        union.update(files)
        per_process[role(d)] = len(files)
    return PathCount(union, set(union) - set(called), per_process)


def role(dump: dict) -> str:
    """A server process by what it does: its multiprocessing name, or its command."""
    if dump["name"] != "MainProcess":
        return f"{dump['name']} ({dump['pid']})"
    argv = " ".join(dump["argv"])
    what = "HTTP" if " serve" in f" {argv}" else (argv.split(" -")[0] or "python")
    return f"{what} ({dump['pid']})"


@contextlib.contextmanager
def recorded_server(model: str | None, folder: Path) -> Iterator[tuple[object, mmap.mmap]]:
    """A server whose processes run the hook; yields it and the control byte."""
    from radixflow.runtime.server.process import ServerProcess

    site = folder / "site"
    site.mkdir()
    shutil.copy(HOOK, site / "sitecustomize.py")
    control_path = folder / "control"
    control_path.write_bytes(bytes([OFF]))
    extra = {"RADIXFLOW_PATH_CONTROL": str(control_path), "RADIXFLOW_PATH_OUT": str(folder),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(site),
                                                         os.environ.get("PYTHONPATH")]))}
    before = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # ServerProcess passes its environment on
    try:
        server = ServerProcess(model, log_level="warning", start_timeout=900)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with open(control_path, "r+b") as f:
        control = mmap.mmap(f.fileno(), 1)
    try:
        yield server, control
    finally:
        server.shutdown()


def chat(url: str, model: str, schema: dict, max_tokens: int) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "person", "schema": schema}}}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    return response.json()


def collect(folder: Path, timeout: float = 30.0) -> list[dict]:
    """Each registered process's dump (the processes that exited are not waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = [int(p.stem) for p in folder.glob("*.pid")]
        waiting = [p for p in pids if Path(f"/proc/{p}").exists()
                   and not (folder / f"{p}.json").exists()]
        if not waiting or time.monotonic() > deadline:
            return [json.loads((folder / f"{p}.json").read_text()) for p in pids
                    if (folder / f"{p}.json").exists()]
        time.sleep(0.05)


def measure(model: str | None, max_tokens: int, settle_s: float) -> tuple[PathCount, dict]:
    with tempfile.TemporaryDirectory(prefix="request-path-") as tmp, \
            recorded_server(model, Path(tmp)) as (server, control):
        served = httpx.get(f"{server.url}/v1/models", timeout=60).json()["data"][0]["id"]
        chat(server.url, served, WARM_UP_SCHEMA, max_tokens)
        time.sleep(settle_s)
        control[0] = ON
        answer = chat(server.url, served, SCHEMA, max_tokens)
        time.sleep(settle_s)  # the scheduler and detokenizer finish their part
        control[0] = DUMP
        dumps = collect(Path(tmp))
    return count(dumps), answer


def cpu_line() -> str:
    from radixflow.kernels.cpu.features import cpu_features

    flags = next((line.split(":", 1)[1].split() for line in
                  Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), [])
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")
             if f in flags]
    return f"{cpu_features().describe()} (/proc/cpuinfo flags: {' '.join(shown) or '-'})"


def report(result: PathCount, answer: dict, args: argparse.Namespace, date: str) -> str:
    folders = result.by_folder()
    lines = [f"# Request path: one json_schema chat request, {date}", "",
             f"Command: `python -m bench.request_path --max-tokens {args.max_tokens}"
             f"{f' --model {args.model}' if args.model else ''}`", "",
             f"CPU: {cpu_line()}. Model: {args.model or 'default (SmolLM2-135M-Instruct)'}; "
             f"{answer['usage']['completion_tokens']} tokens generated under the schema "
             f"(`{json.dumps(SCHEMA)}`), after one warm-up request with another schema.", "",
             f"**{len(result.files)} files, {result.lines} lines** of the library's Python "
             "(lang/, runtime/, radix_cache/, kernels/; a file seen in several processes "
             "counted once), over every process, start-up and warm-up excluded; "
             f"{len(result.only_running)} of them only as frames already running when "
             f"recording began ({', '.join(sorted(result.only_running)) or '-'}).", "",
             f"Per process ({sum(result.per_process.values())} summed; processes that "
             "passed through no library file left out):", "",
             "| process | files |", "|---|---|",
             *[f"| {name} | {n} |" for name, n in sorted(result.per_process.items()) if n], "",
             "| folder | files | lines | which |", "|---|---|---|---|"]
    for folder, names in folders.items():
        folder_lines = sum(result.files[str(Path(folder) / n)] for n in names)
        lines.append(f"| {folder}/ | {len(names)} | {folder_lines} | {', '.join(names)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--settle-s", type=float, default=0.5,
                    help="wait before and after the request, so that start-up work is done "
                         "and the request's last steps are in")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    date = datetime.date.today().isoformat()
    result, answer = measure(args.model, args.max_tokens, args.settle_s)
    publish(report(result, answer, args, date),
            None if args.no_write else Run("request-path", date))


if __name__ == "__main__":
    main()
