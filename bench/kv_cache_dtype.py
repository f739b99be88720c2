"""The attention share of a decode step over a bf16 vs an int8 KV cache (--kv-cache-dtype).

The default engine at the CPU level in force (or --cpu-isa), once per KV dtype; each holds
`--batch` requests of `--context` tokens of random K/V (attention's time does not depend on
the values) at slots of their own, so no shared prefix. Each run feeds every request
`--steps` decode steps through the C decode step with its profile on: attention (thread 0's
share of the step, barrier waits included; with --cpu-time its CPU time, which leaves out what
other processes on a shared machine took) and the whole step (wall time), per step. Runs alternate
between the dtypes (bf16, int8, int8, bf16, ...) and the medians are reported, with the pool's
tokens per GiB of each.

    python -m bench.kv_cache_dtype --batch 8 --context 2000 --steps 20 --reps 4

`--workloads multi_turn shared_prefix` serves bench/workloads.py's workloads instead, through
`radixflow serve` with each KV dtype in turn (one server at a time, alternating), and reports
the median output tokens/s, TPOT and TTFT per workload and dtype.

    python -m bench.kv_cache_dtype --workloads multi_turn shared_prefix --reps 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

DTYPES = ("bfloat16", "int8")


class Setup:
    """An engine over one KV dtype, with `batch` requests of `context` tokens in its pool."""

    def __init__(self, kv: str, batch: int, context: int, steps: int, level: str | None,
                 threads: int | None = None, cpu_time: bool = False):
        from radixflow.runtime.engine import Engine

        args = {"cpu_isa": level} if level else {}
        if threads:
            args["num_threads"] = threads
        self.cpu_time = cpu_time
        self.engine = Engine(None, max_total_tokens=batch * (context + steps) + 8,
                             max_running_requests=max(batch, 8), kv_cache_dtype=kv, **args)
        runner = self.runner = self.engine.scheduler.runner  # idle: the engine has no request
        if runner.cpu_decode is None:
            raise SystemExit("the C decode step does not run here")
        pool, ma = runner.kv_pool, runner.model_args
        g = torch.Generator().manual_seed(0)
        self.rows, self.slots = [], []
        for _ in range(batch):
            row, slots = runner.req_to_token_pool.alloc(), pool.alloc(context + steps)
            runner.req_to_token_pool.req_to_token[row, :context + steps] = slots.to(torch.int32)
            self.rows.append(row)
            self.slots.append(slots)
            for layer in range(ma.num_layers):
                k, v = (torch.randn(context, ma.num_kv_heads, ma.head_dim, generator=g)
                        for _ in range(2))
                pool.write(layer, slots[:context], k, v)
        self.context, self.steps = context, steps
        self.level = runner.kernel_level
        self.tokens_per_gib = 2**30 / pool.bytes_per_token(ma.num_layers, ma.num_kv_heads,
                                                            ma.head_dim, runner.kv_dtype)

    def run(self) -> tuple[float, float]:
        """(attention ms, step ms) per step, over `steps` steps."""
        from radixflow.runtime.forward_batch import ForwardMode
        from radixflow.runtime.model_runner import BatchRequest

        step = self.runner.cpu_decode.step
        step.profile(True, cpu_time=self.cpu_time)
        started = time.perf_counter()
        for i in range(self.steps):
            pos = self.context + i
            parts = [BatchRequest(row, [17 + i], pos, [0]) for row in self.rows]
            out = torch.stack([s[pos] for s in self.slots])
            self.runner.forward(ForwardMode.DECODE, parts, out)
        wall = time.perf_counter() - started
        attn = step.profile(False)["attention"]
        return 1e3 * attn / self.steps, 1e3 * wall / self.steps

    def close(self) -> None:
        self.engine.shutdown()


def serve_workloads(names: list[str], reps: int, sessions: int, concurrency: int,
                    level: str | None) -> None:
    """Each workload through a server per KV dtype, alternating; medians per dtype."""
    import asyncio

    from radixflow.runtime.server.process import ServerProcess

    from . import workloads as wl
    from .loadgen import run_workload

    got: dict[tuple[str, str], list[dict]] = {}
    for rep in range(reps):
        for kv in DTYPES if rep % 2 == 0 else DTYPES[::-1]:
            extra = {"cpu_isa": level} if level else {}
            with ServerProcess(None, kv_cache_dtype=kv, **extra) as server:
                for name in names:
                    workload = wl.build(name, num_sessions=sessions, concurrency=concurrency,
                                        seed=rep)
                    summary = asyncio.run(run_workload(server.url, workload))["summary"]
                    got.setdefault((name, kv), []).append(summary)
                    print(kv, name, {k: summary[k] for k in (
                        "output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "cache_hit_rate",
                        "errors")}, flush=True)
    print(f"\n{sessions} sessions at concurrency {concurrency}, {reps} runs per dtype "
          "(seeds 0..; each seed served by both)")
    print("| workload | KV cache | output tok/s | TPOT p50 ms | TTFT p50 ms | cache hit rate |")
    print("|---|---|---|---|---|---|")
    for (name, kv), runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in (
            "output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "cache_hit_rate")}
        print(f"| {name} | {kv} | {med['output_tok_s']:.1f} | {med['tpot_ms_p50']:.1f} | "
              f"{med['ttft_ms_p50']:.0f} | {med['cache_hit_rate']:.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=4, help="runs per dtype, alternating")
    ap.add_argument("--cpu-isa", default=None)
    ap.add_argument("--threads", type=int, default=None, help="--num-threads (default: all)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="attention as thread 0's CPU time rather than wall time")
    ap.add_argument("--workloads", nargs="+", help="serve these bench/workloads.py workloads")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    if args.workloads:
        serve_workloads(args.workloads, args.reps, args.sessions, args.concurrency, args.cpu_isa)
        return
    setups = {kv: Setup(kv, args.batch, args.context, args.steps, args.cpu_isa, args.threads,
                        args.cpu_time) for kv in DTYPES}
    for setup in setups.values():
        setup.run()  # warm: first-touch of the pool, caches
    got: dict[str, list[tuple[float, float]]] = {kv: [] for kv in DTYPES}
    for rep in range(args.reps):
        for kv in DTYPES if rep % 2 == 0 else DTYPES[::-1]:
            got[kv].append(setups[kv].run())
            attn, step = got[kv][-1]
            print(f"{kv} attention {attn:.2f} ms, step {step:.2f} ms", flush=True)
    level = setups["int8"].level
    for setup in setups.values():
        setup.close()
    med = {kv: (statistics.median(a for a, _ in got[kv]), statistics.median(s for _, s in got[kv]))
           for kv in DTYPES}
    print(f"\nbatch {args.batch}, context {args.context}, {args.steps} steps a run, "
          f"{args.reps} runs per dtype, level {level}, threads {args.threads or 'all'}, "
          f"attention as {'CPU' if args.cpu_time else 'wall'} time")
    print("| KV cache | attention ms/step | step ms/step | attention share | tokens per GiB |")
    print("|---|---|---|---|---|")
    for kv in DTYPES:
        attn, step = med[kv]
        print(f"| {kv} | {attn:.2f} | {step:.2f} | {attn / step:.0%} | "
              f"{setups[kv].tokens_per_gib:,.0f} |")
    print(f"attention bf16 / int8: {med['bfloat16'][0] / med['int8'][0]:.2f}x; step: "
          f"{med['bfloat16'][1] / med['int8'][1]:.2f}x; tokens per GiB int8 / bf16: "
          f"{setups['int8'].tokens_per_gib / setups['bfloat16'].tokens_per_gib:.2f}x")


if __name__ == "__main__":
    main()
