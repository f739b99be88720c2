"""Tensor parallelism on this machine's CPU: --tp-size 1 vs 2 vs 3 on the default model.

For each configuration, one in-process Engine (ranks 1.. as subprocesses), one at a time:
- prefill: one ~500-token prompt (cache flushed), time to its first token;
- single stream: time per output token, from a 1-token and a (1 + N)-token request;
- batch: B prompts x N tokens, output tokens per second;
- the collectives' share of rank 0's time in the decode runs: seconds inside all_reduce,
  gather and broadcast (waiting for the other ranks included) over the wall time.

SmolLM2-135M splits over 1 or 3 ranks (9 heads, 3 KV heads); --tp-size 2 does not divide its
9 heads, so TP=2 runs a same-shaped model with 8 heads (--tp2-heads 8, random weights, same
sizes otherwise): its timings stand for TP=2, its outputs mean nothing.

    python -m bench.tp                      # a section of bench/results/tp.md
    python -m bench.tp --dtype float32 --tp 1 3 --tokens 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

from .report import Run, fmt, publish, run_key

PROMPT_TEXT = ("The cache keeps every prefix that two requests share, so the second request "
               "starts where the first one stopped.")


def long_prompt(tokenizer, tokens: int, salt: int) -> str:
    words, text = [], ""
    while len(tokenizer(text).input_ids) < tokens:
        words += [f"{salt}", PROMPT_TEXT]
        text = " ".join(words)
    return text


SMOLLM2_SHAPE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                 "intermediate_size": 1536, "num_hidden_layers": 30, "head_dim": 64,
                 "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                 "tie_word_embeddings": True, "torch_dtype": "float32"}


def random_model(dest: Path, heads: int = 8, kv_heads: int = 2) -> Path:
    """SmolLM2-135M's shape with `heads` attention heads of 64 (8: q/o 512 wide instead of
    576, divisible by 2) and random weights, with the default model's tokenizer when it is
    cached here, else the tests' tiny BPE (a 512-token vocabulary)."""
    import torch
    from safetensors.torch import save_file

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    try:
        from radixflow.runtime.model_loader import resolve_model

        folder = Path(resolve_model(None))
        for name in os.listdir(folder):
            if name.startswith(("tokenizer", "special_tokens", "generation_config")) or \
                    name.endswith(".jinja"):
                (dest / name).write_bytes((folder / name).read_bytes())
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        ends = {"bos_token_id": 1, "eos_token_id": 2}
    except Exception:  # no network, no cache: the tests' tokenizer
        import sys

        sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
        from helpers.tiny_models import make_tiny_tokenizer

        tokenizer = make_tiny_tokenizer()
        tokenizer.save_pretrained(dest)
        vocab, ends = len(tokenizer), {"bos_token_id": 1, "eos_token_id": 2}
    config = {**SMOLLM2_SHAPE, **ends, "vocab_size": vocab, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads}
    h, inter = config["hidden_size"], config["intermediate_size"]
    gen = torch.Generator().manual_seed(0)

    def w(*shape):
        return (0.02 * torch.randn(*shape, generator=gen)).contiguous()

    tensors = {"model.embed_tokens.weight": w(vocab, h), "model.norm.weight": torch.ones(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": w(heads * 64, h),
            p + "self_attn.k_proj.weight": w(kv_heads * 64, h),
            p + "self_attn.v_proj.weight": w(kv_heads * 64, h),
            p + "self_attn.o_proj.weight": w(h, heads * 64),
            p + "mlp.gate_proj.weight": w(inter, h),
            p + "mlp.up_proj.weight": w(inter, h),
            p + "mlp.down_proj.weight": w(h, inter),
        })
    save_file(tensors, dest / "model.safetensors", metadata={"format": "pt"})
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def eight_head_copy(dest: Path) -> Path:
    return random_model(dest, heads=8, kv_heads=2)


def comm(engine) -> tuple[float, int]:
    tp = engine.scheduler.runner.tp
    if tp is None:
        return 0.0, 0
    return sum(tp.comm_seconds.values()), sum(tp.comm_calls.values())


def measure(model: str | None, tp: int, args: argparse.Namespace) -> dict:
    from radixflow.runtime.engine import Engine

    start = time.perf_counter()
    extra = {"disable_cpu_decode": True} if args.torch_ops and tp == 1 else {}
    engine = Engine(model, tp_size=tp, dtype=args.dtype, max_total_tokens=8192,
                    max_running_requests=max(8, args.batch), **extra)
    startup = time.perf_counter() - start
    try:
        runner = engine.scheduler.runner
        info = {"tp": tp, "startup_s": startup, "dtype": str(runner.dtype),
                "quantization": runner.quantization,
                "decode_step": "C" if runner.cpu_decode is not None else "torch ops",
                "threads_rank0": __import__("torch").get_num_threads()}
        tok = engine.tokenizer
        greedy = {"temperature": 0, "ignore_eos": True}
        engine.generate("warm up", {"max_new_tokens": 4, **greedy})
        prefill, tpot, batch_tps, shares, steps_ms = [], [], [], [], []
        for rep in range(args.repeats):
            engine.flush_cache()
            prompt = long_prompt(tok, args.prompt_tokens, rep)
            t0 = time.perf_counter()
            engine.generate(prompt, {"max_new_tokens": 1, **greedy})
            prefill.append(time.perf_counter() - t0)
            short = f"{rep} Once upon a time"
            engine.flush_cache()
            t0 = time.perf_counter()
            engine.generate(short, {"max_new_tokens": 1, **greedy})
            one = time.perf_counter() - t0
            engine.flush_cache()
            c0, n0 = comm(engine)
            t0 = time.perf_counter()
            engine.generate(short, {"max_new_tokens": 1 + args.tokens, **greedy})
            wall = time.perf_counter() - t0
            c1, n1 = comm(engine)
            tpot.append((wall - one) / args.tokens)
            shares.append((c1 - c0) / wall)
            steps_ms.append(1000 * (c1 - c0) / max(1, args.tokens + 1))
            prompts = [f"{rep}.{i} The three primary colors are" for i in range(args.batch)]
            engine.flush_cache()
            c0, _ = comm(engine)
            t0 = time.perf_counter()
            out = engine.generate(prompts, {"max_new_tokens": args.tokens, **greedy})
            wall = time.perf_counter() - t0
            c1, _ = comm(engine)
            batch_tps.append(sum(r["meta_info"]["completion_tokens"] for r in out) / wall)
            shares.append((c1 - c0) / wall)
        info.update({
            "prefill_s": statistics.median(prefill), "tpot_ms": 1000 * statistics.median(tpot),
            "batch_tok_s": statistics.median(batch_tps),
            "comm_share_single": statistics.median(shares[0::2]),
            "comm_share_batch": statistics.median(shares[1::2]),
            "comm_ms_per_step": statistics.median(steps_ms),
            "collectives_per_step": (n1 - n0) / max(1, args.tokens + 1) if tp > 1 else 0,
        })
        return info
    finally:
        engine.shutdown()


def _allreduce_rank(rank: int, world: int, port: int, hidden: int, calls: int, out) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=dt.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    x = torch.randn(1, hidden)
    for _ in range(20):
        dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    if rank == 0:
        out.put((time.perf_counter() - start) / calls)
    dist.destroy_process_group()


def allreduce_latency(world: int, hidden: int = 576, calls: int = 300) -> float:
    """Seconds per gloo all_reduce of one token's hidden state ([1, hidden] fp32) between
    `world` processes doing nothing else: the collective's own cost, without waiting for a
    slower rank's layer."""
    import multiprocessing as mp

    from radixflow.runtime.ipc import free_port

    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_allreduce_rank, args=(r, world, port, hidden, calls, out))
             for r in range(world)]
    for p in procs:
        p.start()
    latency = out.get(timeout=300)
    for p in procs:
        p.join()
    return latency


def cpu_line() -> str:
    from radixflow.kernels.cpu.features import cpu_features

    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx2", "fma")))
    return f"{cpu_features().describe()}; {os.cpu_count()} cores; flags: {' '.join(wanted)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--torch-ops", action="store_true",
                        help="TP=1 without the C decode step too (as TP > 1 decodes)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    load_before = os.getloadavg()
    for tp in args.tp:
        model = None
        if tp == 2:
            model = str(eight_head_copy(Path(os.environ.get("TMPDIR", "/tmp")) /
                                        "radixflow-bench-8heads"))
        plain = argparse.Namespace(**{**vars(args), "torch_ops": False})
        rows.append({"model": "SmolLM2-135M" if model is None else "8-head copy", **measure(
            model, tp, plain)})
        print(rows[-1], flush=True)
        if args.torch_ops and tp == 1 and rows[-1]["decode_step"] == "C":
            rows.append({"model": "SmolLM2-135M", **measure(None, 1, args)})
            print(rows[-1], flush=True)
    latencies = {w: allreduce_latency(w) for w in sorted({t for t in args.tp if t > 1})}
    load_after = os.getloadavg()
    date = datetime.date.today().isoformat()
    lines = [f"# Tensor parallelism on a CPU ({date})", "",
             f"CPU: {cpu_line()}.", "",
             f"Load average before / after: {load_before[0]:.1f} / {load_after[0]:.1f} (other "
             "processes were running on this machine).", "",
             f"`python -m bench.tp --tp {' '.join(map(str, args.tp))} --dtype {args.dtype} "
             f"--tokens {args.tokens} --batch {args.batch} --repeats {args.repeats}`: medians.",
             "", "| model | TP | dtype | layers | decode | start-up s | prefill "
             f"{args.prompt_tokens} tok s | TPOT ms | batch {args.batch} tok/s | collectives "
             "/ step | collectives ms / step | comm share single | comm share batch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['tp']} | {r['dtype'].removeprefix('torch.')} | "
            f"{r['quantization']} | {r['decode_step']} | {fmt(r['startup_s'])} | "
            f"{fmt(r['prefill_s'])} | {fmt(r['tpot_ms'])} | {fmt(r['batch_tok_s'])} | "
            f"{fmt(r['collectives_per_step'])} | {fmt(r['comm_ms_per_step'])} | "
            f"{r['comm_share_single']:.0%} | {r['comm_share_batch']:.0%} |")
    if latencies:
        lines += ["", "gloo all_reduce of one token's hidden state ([1, 576] fp32) between "
                  "processes doing nothing else, per call: " + ", ".join(
                      f"{w} ranks {1e3 * t:.2f} ms" for w, t in latencies.items()) + "."]
    out = args.out or Run("tp", run_key(date, "" if args.dtype == "auto" else args.dtype))
    publish("\n".join(lines) + "\n", out, {"rows": rows, "allreduce_s": latencies,
                                          "args": vars(args) | {"out": str(out)}})


if __name__ == "__main__":
    main()
