"""Where a decode step's time goes, measured by taking parts away.

One Engine (default model, default settings) decodes one long greedy request (or --batch N of
them, each its own prompt of --context tokens); its scheduler is stepped directly. Variants
are swapped in and out of the same model and measured in turns (A, B, C, A, B, C, ...), so
that this machine's drift hits all of them alike; each figure is the median over rounds of
the mean of `--steps` decode steps.

- as served: the default weights (int4 layers, Q8_0 head where the checkpoint allows) through
  radixflow's one-call C decode step (runtime/models/cpu_decode.py), whose per-phase timers
  are reported too; with --compile and the C step off, the compiled decode step;
- torch ops: the same step as torch calls (--disable-cpu-decode); the variants below patch
  those calls, so they run with it;
- not compiled (with --compile): the eager model instead;
- bf16 head: the output head through the bf16 weights instead of the Q8_0 kernel;
- bf16 layers: every layer matmul through the bf16 weights (what `--quantization none` runs);
- matmuls stubbed: every quantized matmul replaced by a preallocated zero tensor, so the
  step is everything but the weight reads (norms, rope, attention, sampling, scheduling);
- matmuls + attention stubbed: also attention replaced by a no-op.

    python -m bench.decode_step            # writes bench/results/decode-step-<date>.md
    python -m bench.decode_step --batch 8 --context 600   # ...-batch8.md
    python -m bench.decode_step --cpu-isa avx2    # what an AVX2 machine runs: ...-avx2.md

The report names the CPU and its level, and sets the step against the memory-bandwidth bound
of the bytes it reads (weights, once a step, measured here with a large copy).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch

from .report import RESULTS, publish

_NONE = object()  # an attribute whose value is None, to restore


def make_variants(sched) -> dict[str, Callable]:
    """name -> context manager factory that puts the variant in place for its duration."""
    from radixflow.runtime.models import quant_linear as ql

    model = sched.runner.model
    attn_cls = type(sched.runner.attn)
    zeros: dict = {}

    def zero_matmul(self, x):
        key = (tuple(x.shape), self.out_features)
        if key not in zeros:
            zeros[key] = torch.zeros(*x.shape[:-1], self.out_features, dtype=x.dtype)
        return zeros[key]

    @contextmanager
    def patched(obj, name, value):
        # a class attribute it inherits is restored by deleting it again, not by copying it in
        own = vars(obj).get(name) if isinstance(obj, type) else getattr(obj, name)
        if own is None and not isinstance(obj, type):
            own = _NONE
        setattr(obj, name, value)
        try:
            yield
        finally:
            if own is None:
                delattr(obj, name)
            else:
                setattr(obj, name, None if own is _NONE else own)

    @contextmanager
    def as_served():
        yield

    @contextmanager
    def bf16_head():
        head = model.lm_head
        with patched(model, "lm_head", getattr(head, "dense", head)):
            yield

    @contextmanager
    def bf16_layers():
        def dense_forward(self, x):
            return self.dense(x.to(torch.bfloat16)).to(x.dtype)

        with patched(ql.Int4Linear, "forward", dense_forward):
            yield

    @contextmanager
    def stub_matmuls():
        with patched(ql.QuantLinear, "forward", zero_matmul):
            yield

    @contextmanager
    def stub_matmuls_and_attention():
        with patched(ql.QuantLinear, "forward", zero_matmul), \
                patched(attn_cls, "forward", lambda self, q, k, v, layer_id, batch: q):
            yield

    @contextmanager
    def uncompiled():
        with patched(sched.runner, "compiled_decode", None):
            yield

    c_step = sched.runner.cpu_decode is not None

    @contextmanager
    def torch_ops():
        with patched(sched.runner, "cpu_decode", None):
            yield

    def as_torch_ops(variant):
        @contextmanager
        def run():
            with torch_ops(), variant():
                yield
        return run if c_step else variant

    variants = {"as served": as_served}
    if c_step:
        variants["torch ops"] = torch_ops
        variants["torch ops, matmuls stubbed"] = as_torch_ops(stub_matmuls)
        variants["torch ops, matmuls + attention stubbed"] = \
            as_torch_ops(stub_matmuls_and_attention)
        return variants
    if sched.runner.compiled_decode is not None:
        variants["not compiled"] = uncompiled
    if isinstance(model.lm_head, ql.Q8_0Linear) and model.lm_head.dense is not None:
        variants["bf16 head"] = bf16_head
    if sched.runner.compiled_decode is not None:
        return variants  # the rest patch eager code, which the compiled graph no longer runs
    if any(isinstance(m, ql.Int4Linear) and m.dense is not None for m in model.modules()):
        variants["bf16 layers"] = bf16_layers
    variants["matmuls stubbed"] = stub_matmuls
    variants["matmuls + attention stubbed"] = stub_matmuls_and_attention
    return variants


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="serve with --enable-torch-compile "
                    "(adds a 'not compiled' variant)")
    ap.add_argument("--batch", type=int, default=1, help="requests decoding together (each its "
                    "own prompt: no shared KV)")
    ap.add_argument("--context", type=int, default=0, help="prompt tokens per request (default: "
                    "a one-line prompt)")
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"],
                    help="force radixflow's CPU kernels to this level (see README)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.messages import GenerateReq
    from radixflow.runtime.sampling_params import SamplingParams

    engine = Engine(None, enable_torch_compile=args.compile, cpu_isa=args.cpu_isa)
    sched = engine.scheduler
    engine.shutdown()  # step the scheduler directly, no background thread
    info = sched.model_info()
    ids = engine.tokenizer("Write a long story about a dragon.").input_ids
    if args.context:
        story = "Once upon a time a dragon lived in the hills. " * (args.context // 8 + 1)
        ids = engine.tokenizer(story).input_ids[:args.context]
    variants = make_variants(sched)
    total_steps = args.rounds * len(variants) * (args.steps + 2) + 10
    sched.step([GenerateReq(rid=f"decode-{i}", input_ids=ids if args.batch == 1 else [10 + i] + ids,
                            sampling=SamplingParams(max_new_tokens=total_steps, temperature=0,
                                                    ignore_eos=True))
                for i in range(args.batch)])
    while sched.prefilling or sched.waiting:  # every request decoding before any timing
        sched.step([])

    def mean_step_ms(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            sched.step([])
        return (time.perf_counter() - start) / n * 1e3

    c_step = sched.runner.cpu_decode
    times: dict[str, list[float]] = {name: [] for name in variants}
    phases: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            with variant():
                mean_step_ms(2)  # settle
                if c_step is not None and name == "as served":
                    c_step.step.profile(True)
                times[name].append(mean_step_ms(args.steps))
                if c_step is not None and name == "as served":
                    for phase, sec in c_step.step.profile(False).items():
                        phases[phase] = phases.get(phase, 0.0) + sec
    medians = {name: statistics.median(v) for name, v in times.items()}
    served = medians["as served"]

    date = datetime.date.today().isoformat()
    who = "one request" if args.batch == 1 else f"{args.batch} requests"
    extra = (f"{' --compile' if args.compile else ''}"
             f"{f' --cpu-isa {args.cpu_isa}' if args.cpu_isa != 'auto' else ''}"
             f"{f' --batch {args.batch}' if args.batch > 1 else ''}"
             f"{f' --context {args.context}' if args.context else ''}")
    lines = [f"# Decode step, {who}, {date}", "",
             f"Command: `python -m bench.decode_step --rounds {args.rounds} --steps {args.steps}"
             f"{extra}`", "",
             f"CPU: {sched.runner.cpu.describe()}; kernels: {info['cpu']['kernels']}.", "",
             f"Default model, {info['dtype']}, quantization {info['quantization']}, "
             f"{torch.get_num_threads()} threads; {who} decoding (context grows from "
             f"{len(ids)} tokens by {total_steps} over the run). Median over {args.rounds} rounds "
             f"of {args.steps} steps, variants in turns.", "",
             "| variant | ms per step | tokens/s | vs as served |", "|---|---|---|---|"]
    for name, ms in medians.items():
        lines.append(f"| {name} | {ms:.2f} | {args.batch * 1e3 / ms:.1f} | {ms - served:+.2f} ms |")
    lines.append("")
    weight_bytes, bandwidth = bytes_per_step(sched.runner.model), copy_bandwidth()
    bound_ms = weight_bytes / bandwidth * 1e3
    lines += [f"Bytes a step must read: {weight_bytes / 1e6:.1f} MB of weights (once for the "
              f"whole batch; K/V on top). Memory bandwidth here (a {COPY_MB} MB copy, "
              f"{torch.get_num_threads()} threads, median of 5): {bandwidth / 1e9:.1f} GB/s, so "
              f"a step cannot take less than {bound_ms:.2f} ms ({1e3 / bound_ms:.0f} steps/s); "
              f"as served is {bound_ms / served:.0%} of that bound.", ""]
    if phases:
        measured = args.rounds * args.steps
        lines += ["Inside the C decode step (\"as served\"): thread 0's time per phase, waits for "
                  "the other thread included, mean over all its steps (the rest of a step is "
                  "the scheduler: batch bookkeeping, sampling, detokenizing).", "",
                  "| phase | ms per step | share |", "|---|---|---|"]
        total = sum(phases.values())
        for phase, sec in phases.items():
            lines.append(f"| {phase} | {sec / measured * 1e3:.3f} | {sec / total:.0%} |")
        lines += [f"| all | {total / measured * 1e3:.3f} | |", ""]
    publish("\n".join(lines), None if args.no_write else
            RESULTS / f"decode-step-{date}{'-compiled' if args.compile else ''}"
                      f"{f'-{args.cpu_isa}' if args.cpu_isa != 'auto' else ''}"
                      f"{f'-batch{args.batch}' if args.batch > 1 else ''}.md")


COPY_MB = 512


def bytes_per_step(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: each linear's quantized (tiled) or dense weights,
    plus one embedding row (negligible) and the norms."""
    total, dense_copies = 0, set()
    for module in model.modules():
        tiled = getattr(module, "tiled", None)
        if tiled is not None:  # a quantized layer: its dense copy serves only many rows
            total += tiled.nbytes
            dense_copies.update(id(m) for m in module.modules())
        elif type(module) is torch.nn.Linear and id(module) not in dense_copies:
            total += module.weight.numel() * module.weight.element_size()
    return total


def copy_bandwidth() -> float:
    """Bytes/s moved by a large tensor copy (read + write), the median of 5."""
    src = torch.ones(COPY_MB * 2**20 // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times)


if __name__ == "__main__":
    main()
