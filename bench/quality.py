"""How far each weight format moves the default model from its fp32 reference.

Teacher-forced: every engine scores the same text (prompt logprobs), so the figures do not
depend on where greedy decoding happens to diverge. For each format: mean and max |log p
difference| per token against fp32, the share of positions whose top-1 next token agrees with
fp32's, and the mean negative log-likelihood of the text.

Prefill runs in chunks of --chunk tokens; 4 (the default) keeps every matmul within the int4
kernel's rows (QUANT_MAX_ROWS; more rows use the bf16 copy of the weights, see
runtime/models/quant_linear.py). The "decode steps" rows feed the same text one token at a
time as decode steps, through radixflow's C decode step (what a lone request's decoding runs),
at each CPU level this machine runs (kernels/cpu/features.py): avx512 (bf16 model, x split into
16-bit integers), avx2 (fp32 model, x quantized to 8-bit groups).

    python -m bench.quality                # a section of bench/results/quality.md

Per GGUF file, beside llama.cpp on the same files (bench/quality_files.py: KL divergence, top-1
agreement and ln PPL ratio, each engine against itself on the bf16 file):

    python -m bench.quality --reference /tmp/scale/llama-1b-bf16.gguf \
        --gguf /tmp/scale/llama-1b-Q4_K_M.gguf /tmp/scale/llama-1b-Q4_0.gguf \
        --llama-perplexity /tmp/anchor-llamacpp/build/bin/llama-perplexity
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import torch

from .report import Run, publish

FORMATS = {
    "fp32": {"dtype": "float32", "quantization": "none"},
    "bf16": {"dtype": "bfloat16", "quantization": "none"},
    "bf16 + int4 (quantization auto), avx512": {"dtype": "bfloat16", "quantization": "auto",
                                                "cpu_isa": "avx512"},
    "fp32 + int4 (quantization auto), avx2": {"quantization": "auto", "cpu_isa": "avx2"},
}


def score(text: str, chunk: int, **engine_args) -> tuple[torch.Tensor, list[int], str, list[int]]:
    """(logprob of each token after the first, fp32-comparable top-1 ids, applied quantization,
    the text's token ids)."""
    from radixflow.runtime.engine import Engine

    with Engine(None, max_total_tokens=8192, chunked_prefill_size=chunk, **engine_args) as engine:
        res = engine.generate(text, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True,
                              logprob_start_len=0, top_logprobs_num=1)
        info = res["meta_info"]
        applied = engine.scheduler.model_info()["quantization"]
    logprobs = torch.tensor([lp for lp, _, _ in info["input_token_logprobs"][1:]])
    top = [t[0][1] for t in info["input_top_logprobs"][1:]]
    ids = [tok for _, tok, _ in info["input_token_logprobs"]]
    return logprobs, top, applied, ids


def score_decode(ids: list[int], level: str, **engine_args
                 ) -> tuple[torch.Tensor, list[int], str, list[int]]:
    """As `score`, the default engine's weights at CPU level `level`, every token fed as a
    one-token decode step."""
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.forward_batch import ForwardMode
    from radixflow.runtime.model_runner import BatchRequest

    with Engine(None, max_total_tokens=8192, cpu_isa=level, **engine_args) as engine:
        runner = engine.scheduler.runner  # idle: the engine has no request
        if runner.cpu_decode is None:
            raise SystemExit("the C decode step does not run on this machine")
        row, slots = runner.req_to_token_pool.alloc(), runner.kv_pool.alloc(len(ids))
        runner.req_to_token_pool.req_to_token[row, :len(ids)] = slots.to(torch.int32)
        logits = torch.cat([
            runner.forward(ForwardMode.DECODE, [BatchRequest(row, [tok], i, [0])], slots[i:i + 1])
            for i, tok in enumerate(ids[:-1])])
        runner.kv_pool.free(slots)
        runner.req_to_token_pool.free(row)
        applied = engine.scheduler.model_info()["quantization"]
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1)
    return chosen, logprobs.argmax(-1).tolist(), applied, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--text", type=Path, default=Path(__file__).parent.parent / "docs" / "dsl.md")
    ap.add_argument("--chars", type=int, default=4000, help="score the first N characters")
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--gguf", nargs="+", help="quantized GGUF files to score against --reference")
    ap.add_argument("--reference", help="the same model's bf16 GGUF")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama-perplexity -c)")
    ap.add_argument("--cpu-isa", default=None, help="radixflow's CPU level (default: the best)")
    ap.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary")
    ap.add_argument("--llama-args", default="", help="extra llama-perplexity arguments")
    ap.add_argument("--kv-cache-dtype", default=None,
                    help="score the default engine with this KV cache dtype (int8) against "
                    "bf16 KV instead (the text: --text, then the other docs/*.md, to --chars)")
    ap.add_argument("--chat", action="store_true",
                    help="--kv-cache-dtype: the text as a chat request's prompt (the model's "
                    "chat template around it: its first token every chat prompt's)")
    ap.add_argument("--fp32-weights-only", action="store_true",
                    help="--kv-cache-dtype: only the rows with dense fp32 weights")
    ap.add_argument("--together", action="store_true",
                    help="--gguf: radixflow scores every chunk side by side in one decode batch "
                    "(a batch's precision) instead of one chunk at a time")
    args = ap.parse_args()
    if args.gguf:
        files_main(args)
        return
    if args.kv_cache_dtype:
        kv_main(args)
        return

    from radixflow.kernels.cpu.features import detect, supported_levels

    levels = [lv for lv in supported_levels() if lv != "generic"]
    text = args.text.read_text()[:args.chars]
    scored = {name: score(text, args.chunk, **engine_args) for name, engine_args in FORMATS.items()
              if engine_args.get("cpu_isa", "generic") in levels + ["generic"]}
    for level in levels:
        scored[f"int4, decode steps (C step), {level}"] = score_decode(scored["fp32"][3], level)
    ref, ref_top, _, _ = scored["fp32"]
    rows = ["| weights | applied | mean abs d logprob | max abs d logprob | top-1 agrees with fp32 "
            "| mean NLL |", "|---|---|---|---|---|---|"]
    for name, (logprobs, top, applied, _) in scored.items():
        diff = (logprobs - ref).abs()
        agree = sum(a == b for a, b in zip(top, ref_top)) / len(top)
        rows.append(f"| {name} | {applied} | {diff.mean():.4f} | {diff.max():.3f} | {agree:.1%} "
                    f"| {-logprobs.mean():.4f} |")
    date = datetime.date.today().isoformat()
    lines = [f"# Weight formats vs fp32, default model, {date}", "",
             f"Command: `python -m bench.quality --chars {args.chars} --chunk {args.chunk}`", "",
             f"CPU: {detect().describe()}; levels measured: {', '.join(levels)}.", "",
             f"Text: the first {args.chars} characters of `{args.text.name}` ({len(ref)} scored "
             f"tokens), prefilled in chunks of {args.chunk} tokens; the decode-step rows feed it "
             "one token at a time through the C decode step (fp32 residual stream, bf16 K/V; "
             "matmul inputs split into 16-bit integers per group at avx512, closer to fp32 than "
             "the bf16 model's own ops; quantized to 8-bit groups at avx2, as llama.cpp does).",
             "", *rows, ""]
    publish("\n".join(lines), None if args.no_write else Run("quality", date))


def kv_main(args: argparse.Namespace) -> None:
    """--kv-cache-dtype: the default engine over that KV cache against itself over a bf16 one,
    both ways the text can be fed: prefill in chunks of --chunk tokens (each chunk attends to
    the KV cache of the ones before it), and one-token decode steps through the C decode step
    at each CPU level this machine runs."""
    from radixflow.kernels.cpu.features import detect, supported_levels

    docs = Path(__file__).parent.parent / "docs"
    texts = [args.text] + sorted(p for p in docs.glob("*.md") if p != args.text)
    text = "\n\n".join(p.read_text() for p in texts)[:args.chars]
    if args.chat:
        text = _as_chat_prompt(text)
    levels = [lv for lv in supported_levels() if lv != "generic"]
    kv, rows = args.kv_cache_dtype, []
    dense = {"quantization": "none", "dtype": "float32"}  # no int8 activations: a low floor
    pairs = {  # name: (run(kv dtype), the KV dtype compared with bf16)
        "prefill": (lambda dtype: score(text, args.chunk, kv_cache_dtype=dtype), kv),
        "prefill, fp32 KV (the floor)": (
            lambda dtype: score(text, args.chunk, kv_cache_dtype=dtype), "float32"),
        "prefill, fp32 weights": (lambda dtype: score(text, args.chunk, kv_cache_dtype=dtype,
                                                      **dense), kv),
        "prefill, fp32 weights, fp32 KV (the floor)": (
            lambda dtype: score(text, args.chunk, kv_cache_dtype=dtype, **dense), "float32")}
    for level in levels:
        pairs[f"decode steps (C step), {level}"] = (
            lambda dtype, level=level: score_decode(ids, level, kv_cache_dtype=dtype), kv)
    if args.fp32_weights_only:
        pairs = {name: pair for name, pair in pairs.items() if "fp32 weights" in name}
    ids, baselines = None, {}
    for name, (run, other) in pairs.items():
        key = name.removesuffix(", fp32 KV (the floor)")
        if key not in baselines:
            baselines[key] = run("bfloat16")
        base, base_top, applied, got_ids = baselines[key]
        ids = ids or got_ids
        logprobs, top, _, _ = run(other)
        diff = (logprobs - base).abs()
        agree = sum(a == b for a, b in zip(top, base_top)) / len(top)
        rows.append(f"| {name} | {other} | {applied} | {len(top)} | {diff.mean():.4f} "
                    f"| {diff.max():.3f} | {agree:.2%} | {-base.mean():.4f} "
                    f"| {-logprobs.mean():.4f} |")
    date = datetime.date.today().isoformat()
    chat = " --chat" if args.chat else ""
    only = " --fp32-weights-only" if args.fp32_weights_only else ""
    lines = [f"# {kv} KV cache vs bf16 KV, default model, {date}", "",
             f"Command: `python -m bench.quality --kv-cache-dtype {kv} --chars {args.chars} "
             f"--chunk {args.chunk}{chat}{only}`", "",
             f"CPU: {detect().describe()}; levels measured: {', '.join(levels)}.", "",
             f"Text: the first {args.chars} characters of `{args.text.name}` and the other "
             "docs/*.md after it, teacher-forced; each row the same engine and weights with a "
             f"bf16 and a {kv} KV cache; the floor rows: an fp32 KV cache against bf16 (how "
             "far any small change of K/V moves that engine: its int8 activations, the default "
             "weights', amplify it)." + (" The text is the user message of a chat prompt "
                                          "(the chat template around it)." if chat else ""), "",
             "| fed as | KV vs bf16 KV | weights | scored tokens | mean abs d logprob "
             "| max abs d logprob | top-1 agrees with bf16 KV | mean NLL, bf16 KV "
             "| mean NLL, this KV |",
             "|---|---|---|---|---|---|---|---|---|", *rows, ""]
    key = f"{date}-kv-{kv}-{args.chars}{'-chat' if chat else ''}"
    publish("\n".join(lines), None if args.no_write else Run("quality", key))


def _as_chat_prompt(text: str) -> str:
    """`text` as the user message of a chat prompt, rendered by the default model's chat
    template as the server renders one."""
    from radixflow.runtime.model_loader import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(None))
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def files_main(args: argparse.Namespace) -> None:
    import os
    import shlex

    from radixflow.kernels.cpu.features import detect

    from .quality_files import llama_cpp_costs, radixflow_costs, table

    if not args.reference:
        raise SystemExit("--gguf needs --reference, the same model's bf16 GGUF")
    text = args.text.read_text()[:args.chars]
    ours, n_tokens = radixflow_costs(args.gguf, args.reference, text, args.ctx, args.cpu_isa,
                                     args.together)
    theirs = None
    if args.llama_perplexity:
        theirs = llama_cpp_costs(args.llama_perplexity, args.gguf, args.reference, text, args.ctx,
                                 len(os.sched_getaffinity(0)), shlex.split(args.llama_args))
    date = datetime.date.today().isoformat()
    level = f" ({args.cpu_isa})" if args.cpu_isa else ""
    command = " ".join(["python -m bench.quality", "--reference", args.reference, "--gguf",
                        *args.gguf, "--chars", str(args.chars), "--ctx", str(args.ctx)]
                       + (["--cpu-isa", args.cpu_isa] if args.cpu_isa else [])
                       + (["--together"] if args.together else [])
                       + (["--llama-perplexity", args.llama_perplexity]
                          if args.llama_perplexity else []))
    lines = [f"# GGUF files vs their bf16 file, radixflow and llama.cpp, {date}{level}", "",
             f"Command: `{command}`", "", f"CPU: {detect().describe()}.", "",
             f"Text: the first {args.chars} characters of `{args.text.name}` ({n_tokens} tokens "
             f"under the file's tokenizer), in chunks of {args.ctx}, the second half of each "
             "scored, as `llama-perplexity --kl-divergence` does; each engine against itself on "
             "the bf16 file. radixflow: its C decode step, one token at a time"
             + (", the chunks side by side in one decode batch (x as int8 per group of 32 from "
                "3 rows: a batch's precision)" if args.together else "") + "; llama.cpp: "
             "llama-perplexity (its batch path). Random-weight models (bench/scale_models.py) "
             "have near-flat next-token distributions, so top-1 agreement is low for both "
             "engines; what to read is the two engines side by side.", "",
             *table(args.gguf, ours, theirs), ""]
    key = f"{date}-files" + (f"-{args.cpu_isa}" if args.cpu_isa else "") \
        + ("-together" if args.together else "")
    publish("\n".join(lines), None if args.no_write else Run("quality", key))


if __name__ == "__main__":
    main()
