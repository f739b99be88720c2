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
- prefix per request (with --shared-prefix and the C step): the requests' shared prefix
  attended by each request alone instead of by all of them together (decode.c's cascade off).

    python -m bench.decode_step            # a section of bench/results/decode-step.md
    python -m bench.decode_step --batch 8 --context 600   # its section <date>-batch8
    python -m bench.decode_step --cpu-isa avx2    # what an AVX2 machine runs: <date>-avx2
    python -m bench.decode_step --batch 16 --shared-prefix 1000   # <date>-batch16-shared1000

The report names the CPU and its level, and sets the step against the memory-bandwidth bound
of the bytes it reads (weights, once a step, measured here with a large copy); for the C step,
each weight product's arithmetic rate against the CPU's measured peak (bench/cpu_peak.py).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch

from .report import Run, publish, run_key

_NONE = object()  # an attribute whose value is None, to restore


def make_variants(sched, shared_prefix: bool = False) -> dict[str, Callable]:
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

    @contextmanager
    def prefix_per_request():
        step = sched.runner.cpu_decode.step
        least, step.min_shared_prefix = step.min_shared_prefix, 0
        try:
            yield
        finally:
            step.min_shared_prefix = least

    def as_torch_ops(variant):
        @contextmanager
        def run():
            with torch_ops(), variant():
                yield
        return run if c_step else variant

    variants = {"as served": as_served}
    if c_step and shared_prefix:
        variants["prefix per request"] = prefix_per_request
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
    ap.add_argument("--shared-prefix", type=int, default=0, help="a prefix of this many tokens "
                    "that all --batch requests share (cached once first, so their KV slot rows "
                    "begin alike), each then with a few tokens of its own")
    ap.add_argument("--no-torch-ops", action="store_true", help="skip the torch-ops variants")
    ap.add_argument("--threads", type=int, default=0, help="torch's (and the C step's) threads "
                    "(default: torch's own)")
    ap.add_argument("--cpu-time", action="store_true", help="time the C step's phases by thread "
                    "0's CPU time instead of wall time: on a machine other processes share, "
                    "what the step itself spent (at one thread: its arithmetic alone)")
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2", "generic"],
                    help="force radixflow's CPU kernels to this level (see README)")
    ap.add_argument("--model", default=None, help="a model folder or .gguf file (default: the "
                    "default model); e.g. bench/scale_models.py's /tmp/scale/llama-1b-Q4_K_M.gguf")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.runtime.engine import Engine
    from radixflow.runtime.messages import GenerateReq
    from radixflow.runtime.models.stored_linears import decode_step_bytes
    from radixflow.runtime.sampling_params import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    # no overlap: its forward thread stops with the engine, and each step is timed alone
    engine = Engine(args.model, enable_torch_compile=args.compile, cpu_isa=args.cpu_isa,
                    disable_overlap_schedule=True)
    sched = engine.scheduler
    engine.shutdown()  # step the scheduler directly, no background thread
    info = sched.model_info()
    ids = engine.tokenizer("Write a long story about a dragon.").input_ids
    if args.context:
        story = "Once upon a time a dragon lived in the hills. " * (args.context // 8 + 1)
        ids = engine.tokenizer(story).input_ids[:args.context]
    variants = make_variants(sched, shared_prefix=args.shared_prefix > 0)
    if args.no_torch_ops:
        variants = {k: v for k, v in variants.items() if not k.startswith("torch ops")}
    total_steps = args.rounds * len(variants) * (args.steps + 2) + 10
    prefix: list[int] = []
    if args.shared_prefix:
        story = "Once upon a time a dragon lived in the hills. " * (args.shared_prefix // 8 + 1)
        prefix = engine.tokenizer(story).input_ids[:args.shared_prefix]
        sched.step([GenerateReq(rid="prefix", input_ids=prefix, sampling=SamplingParams(
            max_new_tokens=1, temperature=0, ignore_eos=True))])
        while not sched.is_idle:  # the prefix computed once and left in the radix cache
            sched.step([])

    def prompt(i: int) -> list[int]:
        if prefix:
            return prefix + [10 + i, 20 + i] + ids[:8]
        return ids if args.batch == 1 else [10 + i] + ids

    sched.step([GenerateReq(rid=f"decode-{i}", input_ids=prompt(i),
                            sampling=SamplingParams(max_new_tokens=total_steps, temperature=0,
                                                    ignore_eos=True))
                for i in range(args.batch)])
    while sched.prefilling or sched.waiting:  # every request decoding before any timing
        sched.step([])
    shared_slots = shared_prefix_slots(sched) if prefix else 0

    def mean_step_ms(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            sched.step([])
        return (time.perf_counter() - start) / n * 1e3

    c_step = sched.runner.cpu_decode
    c_variants = {"as served", "prefix per request"} if c_step is not None else set()
    times: dict[str, list[float]] = {name: [] for name in variants}
    # per C-step variant, per round: each phase's ms per step (thread 0)
    rounds: dict[str, list[dict[str, float]]] = {n: [] for n in variants if n in c_variants}
    calls = steps = 0
    for _ in range(args.rounds):
        for name, variant in variants.items():
            with variant():
                mean_step_ms(2)  # settle
                if name in c_variants:
                    c_step.step.profile(True, cpu_time=args.cpu_time)
                    before = c_step.calls
                times[name].append(mean_step_ms(args.steps))
                if name in c_variants:
                    rounds[name].append({phase: sec / args.steps * 1e3 for phase, sec in
                                         c_step.step.profile(False).items()})
                    calls, steps = calls + c_step.calls - before, steps + args.steps
    medians = {name: statistics.median(v) for name, v in times.items()}
    served = medians["as served"]

    date = datetime.date.today().isoformat()
    who = "one request" if args.batch == 1 else f"{args.batch} requests"
    extra = (f"{' --compile' if args.compile else ''}"
             f"{f' --cpu-isa {args.cpu_isa}' if args.cpu_isa != 'auto' else ''}"
             f"{f' --batch {args.batch}' if args.batch > 1 else ''}"
             f"{f' --context {args.context}' if args.context else ''}"
             f"{f' --shared-prefix {args.shared_prefix}' if args.shared_prefix else ''}"
             f"{' --no-torch-ops' if args.no_torch_ops else ''}"
             f"{f' --threads {args.threads}' if args.threads else ''}"
             f"{' --cpu-time' if args.cpu_time else ''}"
             f"{f' --model {args.model}' if args.model else ''}")
    context = (f"a shared {len(prefix)}-token prefix ({shared_slots} KV slots alike in every "
               f"row) plus {len(prompt(0)) - len(prefix)} tokens of each request's own"
               if prefix else f"{len(ids)} tokens")
    model = "Default model" if args.model is None else Path(args.model).name
    lines = [f"# Decode step, {who}, {date}", "",
             f"Command: `python -m bench.decode_step --rounds {args.rounds} --steps {args.steps}"
             f"{extra}`", "",
             f"CPU: {sched.runner.cpu.describe()}; kernels: {info['cpu']['kernels']}.", "",
             f"{model}, {info['dtype']}, quantization {info['quantization']}, "
             f"{torch.get_num_threads()} threads; {who} decoding (context grows from "
             f"{context} by {total_steps} over the run). Median over {args.rounds} rounds "
             f"of {args.steps} steps, variants in turns.", ""]
    if c_step is not None:
        lines += [f"C decode step calls per scheduler step: {calls / max(steps, 1):.2f} "
                  f"(the whole batch of {args.batch} in one call).", ""]
    lines += ["| variant | ms per step | tokens/s | vs as served |", "|---|---|---|---|"]
    for name, ms in medians.items():
        lines.append(f"| {name} | {ms:.2f} | {args.batch * 1e3 / ms:.1f} | {ms - served:+.2f} ms |")
    lines.append("")
    weight_bytes, bandwidth = decode_step_bytes(sched.runner.model), copy_bandwidth()
    bound_ms = weight_bytes / bandwidth * 1e3
    lines += [f"Bytes a step must read: {weight_bytes / 1e6:.1f} MB of weights (once for the "
              f"whole batch; K/V on top). Memory bandwidth here (a {COPY_MB} MB copy, "
              f"{torch.get_num_threads()} threads, median of 5): {bandwidth / 1e9:.1f} GB/s, so "
              f"a step cannot take less than {bound_ms:.2f} ms ({1e3 / bound_ms:.0f} steps/s); "
              f"as served is {bound_ms / served:.0%} of that bound.", ""]
    if rounds:
        names = list(rounds)
        med = {n: {ph: statistics.median(r[ph] for r in rounds[n]) for ph in rounds[n][0]}
               for n in names}
        clock = ("CPU time (time other processes held the core left out; spinning at the "
                 "barriers counted)" if args.cpu_time else "time")
        lines += [f"Inside the C decode step: thread 0's {clock} per phase, waits for the other "
                  "threads included, median over the rounds of each round's mean per step (the "
                  "rest of a step is the scheduler: batch bookkeeping, sampling, detokenizing).",
                  "", "| phase | " + " | ".join(f"{n}: ms | share" for n in names) + " |",
                  "|---|" + "---|---|" * len(names)]
        for phase in med[names[0]]:
            cells = [f"{med[n][phase]:.3f} | {med[n][phase] / sum(med[n].values()):.0%}"
                     for n in names]
            lines.append(f"| {phase} | " + " | ".join(cells) + " |")
        lines += ["| all | " + " | ".join(f"{sum(med[n].values()):.3f} | " for n in names) + " |"]
        if "prefix per request" in med:
            a, b = (med[n]["attention"] for n in ("prefix per request", "as served"))
            paired = statistics.median(
                x["attention"] / y["attention"]
                for x, y in zip(rounds["prefix per request"], rounds["as served"]))
            lines += ["", f"Attention: {a:.3f} ms per step with the prefix per request, {b:.3f} "
                      f"ms shared ({a / b:.1f}x; median of the rounds' paired ratios "
                      f"{paired:.1f}x)."]
        lines.append("")
        lines += product_rates(c_step.step, args.batch, med["as served"], info)
    key = run_key(date, "compiled" if args.compile else "",
                  args.cpu_isa if args.cpu_isa != "auto" else "",
                  f"batch{args.batch}" if args.batch > 1 else "",
                  f"shared{args.shared_prefix}" if args.shared_prefix else "",
                  f"threads{args.threads}" if args.threads else "",
                  Path(args.model).stem if args.model else "")
    publish("\n".join(lines), None if args.no_write else Run("decode-step", key))


def shared_prefix_slots(sched) -> int:
    """How many leading KV slots every decoding request's row holds alike."""
    rows = [r.req_pool_idx for r in sched.running]
    table = sched.req_to_token_pool.req_to_token[rows]
    same = (table == table[:1]).all(dim=0).int()
    return int(same.cumprod(0).sum())


# the C step's product phases -> the weights they multiply
_PRODUCTS = {"qkv matmul": "qkv", "o matmul": "o", "gate/up matmul": "gate_up",
             "down matmul": "down", "head matmul": None}


def product_rates(step, batch: int, phases: dict[str, float], info: dict) -> list[str]:
    """Each weight product's arithmetic rate in the C step (2 ops per multiply-add, B rows),
    against the measured peak of the instruction it is built on (bench/cpu_peak.py)."""
    from radixflow.kernels.cpu import active_level

    from .cpu_peak import peak_gops

    layers, _, head = step._keep
    level = step.level
    peaks = peak_gops(level)
    if level == "avx512":
        nibbles = 1.0 if batch >= 3 else 0.5  # x as int8 from 3 rows (gemv.h's split_mode)
        base = {"q4_k": ("vpdpbusd zmm", nibbles), "q5_k": ("vpdpbusd zmm", nibbles),
                "q4_1": ("vpdpbusd zmm", nibbles),
                "q8_0": ("vpdpbusd zmm", 0.5),
                "q6": ("vpdpbusd zmm", nibbles), "q6_k": ("vpdpbusd zmm", nibbles),
                "bf16": ("vdpbf16ps zmm", 1.0)}
    else:
        base = {"q4_k": ("vpmaddubsw ymm", 1.0), "q5_k": ("vpmaddubsw ymm", 1.0),
                "q4_1": ("vpmaddubsw ymm", 1.0),
                "q8_0": ("vpmaddubsw ymm", 1.0),
                "q6": ("vpmaddubsw ymm", 1.0), "q6_k": ("vpmaddubsw ymm", 1.0),
                "bf16": ("vfmadd231ps ymm", 1.0)}
    lines = [f"Weight products at batch {batch} (level {level}; active level "
             f"{active_level()}): ops = 2 x rows x n x k per product, time = thread 0's phase "
             "(barrier waits included). Peak: bench/cpu_peak.py, the instruction each format "
             "is built on, all threads, each timed by its own CPU time: "
             + ", ".join(f"{k} {v:.0f} GOPS" for k, v in peaks.items())
             + (". The integer formats take two vpdpbusd per weight byte (x as 16-bit "
                "integers), so their ceiling is half that instruction's rate, except q4_1/q4_k/"
                "q5_k/q6/q6_k from 3 rows on (x as int8: one)." if level == "avx512" else "."), "",
             "| product | format | GOP per step | ms per step | GOPS | ceiling GOPS | of ceiling |",
             "|---|---|---|---|---|---|---|"]
    total_ops = total_ms = 0.0
    for phase, name in _PRODUCTS.items():
        weights = [head] if name is None else [getattr(lw, name) for lw in layers]
        ops = sum(2 * batch * w.n * w.k for w in weights)
        fmt = "+".join(sorted({w.format for w in weights}))
        instr, share = base[max({w.format for w in weights}, key=list(base).index)]
        ceiling = peaks[instr] * share
        ms = phases[phase]
        gops = ops / (ms * 1e-3) / 1e9
        total_ops, total_ms = total_ops + ops, total_ms + ms
        lines.append(f"| {phase} | {fmt} | {ops / 1e9:.2f} | {ms:.3f} | {gops:.0f} | "
                     f"{ceiling:.0f} | {gops / ceiling:.0%} |")
    lines += [f"| all | | {total_ops / 1e9:.2f} | {total_ms:.3f} | "
              f"{total_ops / (total_ms * 1e-3) / 1e9:.0f} | | |", ""]
    return lines


COPY_MB = 512


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
