"""Mixture-of-experts decode on the CPU: the one-call C step's MoE layers against the torch-ops
path, on a model of Qwen3-30B-A3B's layer shape.

The model: bench/scale_models.py's QWEN3_30B_A3B (hidden 2048, 32 query / 4 KV heads of 128,
128 experts of 768 features, top 8, renormalised) with --layers of its 48 layers and a
--vocab-entry head, random weights, int4 as `--quantization int4` makes them (Q4_1 groups of 32
for every layer's linears, experts included; the head in bf16 tiles; the routers dense bf16).
Quantizing 128 x --layers experts takes ~1 s each here, so --distinct of them per layer are
quantized and the others are copies of those (each its own memory: the bytes a step reads are
the real model's; the values do not change the speed).

One request decodes (the runner's default dtype: bf16 at avx512, fp32 at avx2; the KV cache
bf16, as the runner sets it up for the C step): each figure is
the median over --rounds of the mean of --steps single-row decode steps, the C step
(runtime/models/cpu_decode.py) and the torch-ops model forward (the runner's path without the C
step: radixflow's row kernels and int4 products, moe.py's grouped experts) in turns, each
request its own context growing over the run.

Bytes per token: what a step must read once: per layer attention (qkv, o), the router (the C
step reads it as fp32) and the 8 routed experts' gate/up and down (the other 120 stay unread),
then the head; against the memory bandwidth of a large copy (bench/decode_step.py's).

    python -m bench.moe_decode                  # a section of bench/results/moe-decode.md
    python -m bench.moe_decode --cpu-isa avx2
"""

from __future__ import annotations

import argparse
import copy
import datetime
import statistics
import time

import torch
from torch import nn

from .decode_step import COPY_MB, copy_bandwidth
from .report import Run, publish, run_key
from .scale_models import QWEN3_30B_A3B


def build_model(layers: int, vocab: int, distinct: int, dtype: torch.dtype, seed: int = 0):
    """The random int4 model, built linear by linear (its fp32 weights whole would not fit)."""
    from radixflow.kernels.cpu.rows import RowKernels
    from radixflow.runtime.models.config import ModelArgs
    from radixflow.runtime.models.llama import LlamaForCausalLM
    from radixflow.runtime.models.moe import SparseMoe
    from radixflow.runtime.models.quant_linear import quantize_linears_

    config = {**QWEN3_30B_A3B, "num_hidden_layers": layers, "vocab_size": vocab,
              "bos_token_id": 1, "eos_token_id": 2}
    args = ModelArgs.from_hf_config(config)
    with torch.device("meta"):
        model = LlamaForCausalLM(args)
    g = torch.Generator().manual_seed(seed)

    def quantized(linear: nn.Linear, head: bool = False) -> nn.Module:
        """A random linear of `linear`'s shape, quantized as the runner does."""
        holder = nn.Module()
        holder.linear = nn.Linear(linear.in_features, linear.out_features, bias=False,
                                  device="meta")
        holder.linear.weight = nn.Parameter(
            torch.randn(linear.out_features, linear.in_features, generator=g) * 0.02,
            requires_grad=False)
        # (dtype fp32: no dense bf16 copy, which only batches of more than 8 rows use)
        quantize_linears_(holder, keep=(holder.linear,) if head else (), dtype=torch.float32)
        return holder.linear

    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        attn.qkv_proj, attn.o_proj = quantized(attn.qkv_proj), quantized(attn.o_proj)
        assert isinstance(mlp, SparseMoe)
        made = []
        for e, expert in enumerate(mlp.experts):
            if e < distinct:
                expert.gate_up_proj = quantized(expert.gate_up_proj)
                expert.down_proj = quantized(expert.down_proj)
                made.append(expert)
            else:  # a copy of one of those, in memory of its own
                mlp.experts[e] = copy.deepcopy(made[e % distinct])
    model.lm_head = quantized(model.lm_head, head=True)
    model.to_empty(device="cpu")  # what is left: norms, embedding, routers
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn(param.shape, generator=g))
            else:
                param.copy_(torch.randn(param.shape, generator=g) * (0.02 if "gate" in name
                                                                     else 1.0))
    model.to(dtype)
    model.reset_rope_tables(torch.device("cpu"), context_len=4096)
    model.bind_row_kernels(RowKernels())
    return model.eval()


class Decoder:
    """One request's decode steps through the C step or the torch-ops forward, each on a KV
    row of its own."""

    def __init__(self, model, max_context: int):
        from radixflow.runtime.attention import create_attention_backend
        from radixflow.runtime.memory_pool import KVPool, ReqToTokenPool
        from radixflow.runtime.models.cpu_decode import CpuDecode

        a = model.args
        self.model = model
        dtype = model.norm.weight.dtype
        self.kv_pool = KVPool(2 * max_context, a.num_layers, a.num_kv_heads, a.head_dim,
                              torch.bfloat16)  # (what the runner picks for the C step)
        self.table = ReqToTokenPool(2, max_context).req_to_token
        self.attn = create_attention_backend("torch_native", torch.device("cpu"), a.num_heads,
                                             a.num_kv_heads, a.head_dim, a.attn_scale,
                                             dtype=dtype)
        self.c_step, why = CpuDecode.build(model, self.kv_pool, a.attn_scale, max_context)
        if self.c_step is None:
            raise SystemExit(f"the C step declines the model: {why}")
        self.pos = [0, 0]
        self.max_context = max_context

    def step(self, c_step: bool) -> torch.Tensor:
        from radixflow.runtime.forward_batch import BatchRequest, ForwardBatch, ForwardMode

        row = 0 if c_step else 1
        pos = self.pos[row]
        if pos >= self.max_context:
            raise SystemExit("the run outgrew --max-context")
        slot = 1 + row * self.max_context + pos
        self.table[row, pos] = slot
        self.pos[row] += 1
        token = 5 + pos % 100
        out_slots = torch.tensor([slot], dtype=torch.int64)
        if c_step:
            return self.c_step.run([BatchRequest(row, [token], pos, [0])], out_slots, self.table)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64)

        batch = ForwardBatch(
            mode=ForwardMode.DECODE, input_ids=t([token]), positions=t([pos]),
            out_slots=out_slots, req_pool_indices=t([row]), seq_lens=t([pos + 1]),
            prefix_lens=t([pos]), extend_lens=t([1]), seq_lens_cpu=[pos + 1],
            prefix_lens_cpu=[pos], extend_lens_cpu=[1], logits_indices=t([0]),
            req_to_token=self.table, kv_pool=self.kv_pool)
        self.attn.prepare(batch)
        return self.model(batch, self.attn)


def read_bytes(model, top_k: int) -> dict[str, int]:
    """The weight bytes one decode step reads, by part (all layers)."""
    from radixflow.runtime.models.moe import SparseMoe

    parts = {"attention (qkv, o)": 0, "router (fp32)": 0, f"{top_k} experts": 0,
             "head": model.lm_head.tiled.nbytes}
    every_expert = 0
    for block in model.layers:
        attn, mlp = block.self_attn, block.mlp
        assert isinstance(mlp, SparseMoe)
        parts["attention (qkv, o)"] += attn.qkv_proj.tiled.nbytes + attn.o_proj.tiled.nbytes
        parts["router (fp32)"] += mlp.gate.weight.numel() * 4
        one = [e.gate_up_proj.tiled.nbytes + e.down_proj.tiled.nbytes for e in mlp.experts]
        parts[f"{top_k} experts"] += top_k * one[0]
        every_expert += sum(one)
    parts["(all experts, had they all been read)"] = every_expert
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--distinct", type=int, default=8, help="experts quantized per layer (the "
                    "others copies of them)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch's (and the C step's) threads "
                    "(default: torch's own)")
    ap.add_argument("--cpu-isa", default="auto", choices=["auto", "avx512", "avx2"])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from radixflow.kernels.cpu import active_level
    from radixflow.kernels.cpu.features import REQUIRED, cpu_features, set_level

    if args.threads:
        torch.set_num_threads(args.threads)
    set_level(args.cpu_isa)
    level = active_level()
    if level is None:
        raise SystemExit("radixflow's CPU kernels do not run here")
    built = time.perf_counter()
    # the runner's default dtype: bf16 where the CPU has bf16 arithmetic (level avx512)
    dtype = torch.bfloat16 if cpu_features().bf16 else torch.float32
    model = build_model(args.layers, args.vocab, args.distinct, dtype)
    built = time.perf_counter() - built
    settle = 2
    dec = Decoder(model, max_context=args.rounds * (args.steps + settle) + 8)
    top_k = model.args.num_experts_per_tok

    def mean_ms(c_step: bool, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            dec.step(c_step)
        return (time.perf_counter() - start) / n * 1e3

    times: dict[str, list[float]] = {"C step": [], "torch ops": []}
    phases: list[dict[str, float]] = []
    with torch.inference_mode():
        first = [dec.step(True), dec.step(False)]  # the same first token both ways
        for _ in range(args.rounds):
            for name in times:
                mean_ms(name == "C step", settle - 1)
                if name == "C step":
                    dec.c_step.step.profile(True)
                times[name].append(mean_ms(name == "C step", args.steps))
                if name == "C step":
                    phases.append({k: v / args.steps * 1e3
                                   for k, v in dec.c_step.step.profile(False).items()})
    close = (first[0] - first[1]).abs().max().item() / first[1].abs().max().item()
    med = {name: statistics.median(v) for name, v in times.items()}
    parts = read_bytes(model, top_k)
    step_bytes = sum(v for k, v in parts.items() if not k.startswith("("))
    bandwidth = copy_bandwidth()
    bound_ms = step_bytes / bandwidth * 1e3

    cpu = cpu_features()
    flags = sorted(f for f in cpu.flags if f in {*REQUIRED["avx512"], *REQUIRED["avx2"]})
    date = datetime.date.today().isoformat()
    extra = "".join(f" --{k.replace('_', '-')} {v}" for k, v in (
        ("layers", args.layers), ("vocab", args.vocab), ("distinct", args.distinct),
        ("rounds", args.rounds), ("steps", args.steps)) if v != ap.get_default(k))
    extra += f" --threads {args.threads}" if args.threads else ""
    extra += f" --cpu-isa {args.cpu_isa}" if args.cpu_isa != "auto" else ""
    lines = [f"# MoE decode step, Qwen3-30B-A3B layers, {date}", "",
             f"Command: `python -m bench.moe_decode{extra}`", "",
             f"CPU: {cpu.describe()}; kernels: {level} (/proc/cpuinfo flags of the levels: "
             f"{' '.join(flags)}); {torch.get_num_threads()} threads.", "",
             f"Model: Qwen3-30B-A3B's layer shape (hidden 2048, 32 / 4 heads of 128, 128 experts "
             f"of 768, top {top_k}, renormalised), {args.layers} of its 48 layers, a "
             f"{args.vocab}-entry head; random weights, int4 (Q4_1; the head bf16 tiles), "
             f"{str(dtype).removeprefix('torch.')} model (the runner's default here), bf16 "
             f"KV cache ({args.distinct} distinct experts a layer, the others "
             f"copies in memory of their own; built in {built:.0f} s). One request, median over "
             f"{args.rounds} rounds of the mean of {args.steps} single-row decode steps, the "
             "two paths in turns; the first step's logits of the two paths differ by "
             f"{close:.1%} of their largest.", "",
             "| path | ms per step | tokens/s | vs C step |", "|---|---|---|---|"]
    for name, ms in med.items():
        lines.append(f"| {name} | {ms:.2f} | {1e3 / ms:.1f} | {ms / med['C step']:.2f}x |")
    lines += ["", f"Bytes a step must read (weights, once; K/V on top), {args.layers} layers:",
              "", "| part | MB |", "|---|---|"]
    lines += [f"| {k} | {v / 1e6:.1f} |" for k, v in parts.items()]
    held = (parts["attention (qkv, o)"] + parts["router (fp32)"]
            + parts["(all experts, had they all been read)"]) / args.layers
    lines += [f"| all read | {step_bytes / 1e6:.1f} |", "",
              f"Memory bandwidth here (a {COPY_MB} MB copy, {torch.get_num_threads()} threads, "
              f"median of 5): {bandwidth / 1e9:.1f} GB/s, so a step cannot take less than "
              f"{bound_ms:.2f} ms; the C step is at {bound_ms / med['C step']:.0%} of that bound, "
              f"torch ops at {bound_ms / med['torch ops']:.0%}. Per layer: "
              f"{(step_bytes - parts['head']) / args.layers / 1e6:.1f} MB read of "
              f"{held / 1e6:.1f} MB held.",
              ""]
    med_phases = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    total = sum(med_phases.values())
    lines += ["Inside the C step: thread 0's time per phase (barrier waits included), median "
              "over the rounds of the mean per step.", "", "| phase | ms | share |",
              "|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | {v / total:.0%} |" for k, v in med_phases.items() if v > 0]
    lines += [f"| all | {total:.3f} | |", ""]
    key = run_key(date, args.cpu_isa if args.cpu_isa != "auto" else level,
                  f"threads{args.threads}" if args.threads else "")
    raw = {"times_ms": times, "phases_ms": phases, "bytes": parts, "bandwidth": bandwidth,
           "level": level, "flags": flags}
    publish("\n".join(lines), None if args.no_write else Run("moe-decode", key), raw)


if __name__ == "__main__":
    main()
