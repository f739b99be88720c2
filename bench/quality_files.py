"""What a GGUF file's quantization costs, radixflow beside llama.cpp on the same files.

Both engines score the same text the way llama.cpp's `llama-perplexity --kl-divergence` does:
the tokens in chunks of --ctx, each chunk on its own (the first token replaced by BOS where the
vocabulary adds one), the second half of each chunk scored. Each engine is set against itself on
the bf16 file (what quantization costs inside one engine, not how two engines differ):

- mean KL divergence of the next-token distribution from the bf16 one;
- top-1 agreement with bf16 (llama.cpp's "Same top p");
- ln(PPL(Q) / PPL(bf16)), the mean change in the text's log-likelihood per token.

radixflow's rows come from its C decode step (what generated tokens run through), fed one token
at a time: one chunk at a time, or (together) every chunk side by side in one decode batch, as
requests decoding together run (x as int8 from --cpu-batch-int8-rows rows); llama.cpp's from
`llama-perplexity` (its prompt path, repacked weights where it repacks). Used by
`python -m bench.quality --gguf ...`.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Cost:
    kld: float
    top1: float
    ln_ppl_ratio: float
    tokens: int


def chunks_of(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    out = [ids[i:i + ctx] for i in range(0, len(ids) - ctx + 1, ctx)]
    if not out:
        raise SystemExit(f"the text has {len(ids)} tokens; --ctx {ctx} needs at least that many")
    if bos is not None:
        out = [[bos, *c[1:]] for c in out]
    return out


def text_ids(model: str, text: str) -> tuple[list[int], int | None]:
    """The text's token ids under the file's own tokenizer (no special tokens added) and the BOS
    id if the vocabulary adds one."""
    from radixflow.runtime.model_loader.hf_folder import load_tokenizer
    from radixflow.runtime.model_loader.resolve import resolve_model

    tok = load_tokenizer(resolve_model(model))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with_special = tok("a")["input_ids"]
    adds_bos = tok.bos_token_id is not None and with_special[:1] == [tok.bos_token_id]
    return ids, (tok.bos_token_id if adds_bos else None)


def radixflow_logprobs(model: str, chunks: list[list[int]], level: str | None,
                       together: bool = False) -> torch.Tensor:
    """log-softmax rows [chunks * (ctx - 1 - ctx // 2), vocab] of the scored positions, every
    token fed as a one-token decode step: one chunk at a time, or every chunk's i-th token in
    one step (`together`)."""
    from radixflow.runtime.engine import Engine
    from radixflow.runtime.forward_batch import ForwardMode
    from radixflow.runtime.model_runner import BatchRequest

    ctx = len(chunks[0])
    first = ctx // 2
    rows = []
    args = {"cpu_isa": level} if level else {}
    with Engine(model, max_total_tokens=max(4096, (len(chunks) + 1) * ctx), **args) as engine:
        runner = engine.scheduler.runner  # idle: the engine has no request
        if together:
            return _side_by_side(runner, chunks, first)
        for ids in chunks:
            row, slots = runner.req_to_token_pool.alloc(), runner.kv_pool.alloc(len(ids))
            runner.req_to_token_pool.req_to_token[row, :len(ids)] = slots.to(torch.int32)
            try:
                for i, tok in enumerate(ids[:-1]):
                    logits = runner.forward(ForwardMode.DECODE, [BatchRequest(row, [tok], i, [0])],
                                            slots[i:i + 1])
                    if i >= first:
                        rows.append(torch.log_softmax(logits.float(), dim=-1))
            finally:
                runner.kv_pool.free(slots)
                runner.req_to_token_pool.free(row)
    return torch.cat(rows)


def _side_by_side(runner, chunks: list[list[int]], first: int) -> torch.Tensor:
    from radixflow.runtime.forward_batch import ForwardMode
    from radixflow.runtime.model_runner import BatchRequest

    rows = [runner.req_to_token_pool.alloc() for _ in chunks]
    slots = [runner.kv_pool.alloc(len(ids)) for ids in chunks]
    per_chunk: list[list[torch.Tensor]] = [[] for _ in chunks]
    try:
        for row, s in zip(rows, slots, strict=True):
            runner.req_to_token_pool.req_to_token[row, :len(s)] = s.to(torch.int32)
        for i in range(len(chunks[0]) - 1):
            step = [BatchRequest(row, [ids[i]], i, [0])
                    for row, ids in zip(rows, chunks, strict=True)]
            out_slots = torch.cat([s[i:i + 1] for s in slots])
            logits = runner.forward(ForwardMode.DECODE, step, out_slots)
            if i >= first:
                for c in range(len(chunks)):
                    per_chunk[c].append(torch.log_softmax(logits[c:c + 1].float(), dim=-1))
    finally:
        for row, s in zip(rows, slots, strict=True):
            runner.kv_pool.free(s)
            runner.req_to_token_pool.free(row)
    return torch.cat([r for chunk in per_chunk for r in chunk])


def cost(quant: torch.Tensor, base: torch.Tensor, targets: torch.Tensor) -> Cost:
    kld = (base.exp() * (base - quant)).sum(-1)
    top1 = (quant.argmax(-1) == base.argmax(-1)).float().mean()
    d = quant.gather(1, targets[:, None]) - base.gather(1, targets[:, None])
    return Cost(float(kld.mean()), float(top1), float(-d.mean()), len(targets))


def scored_targets(chunks: list[list[int]]) -> torch.Tensor:
    ctx = len(chunks[0])
    return torch.tensor([t for c in chunks for t in c[ctx // 2 + 1:]])


def radixflow_costs(files: list[str], reference: str, text: str, ctx: int,
                    level: str | None, together: bool = False) -> tuple[dict[str, Cost], int]:
    ids, bos = text_ids(reference, text)
    chunks = chunks_of(ids, ctx, bos)
    targets = scored_targets(chunks)
    base = radixflow_logprobs(reference, chunks, level)  # (one at a time: bf16 x is exact)
    return {f: cost(radixflow_logprobs(f, chunks, level, together), base, targets)
            for f in files}, len(ids)


_PATTERNS = {
    "kld": r"Mean\s+KLD:\s+([-\d.eE+]+)",
    "top1": r"Same top p:\s+([-\d.]+)\s*±",
    "ln_ppl_ratio": r"Mean\s+ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s+([-\d.eE+]+)",
}


def parse_kld_log(log: str) -> Cost:
    found = {}
    for key, pattern in _PATTERNS.items():
        m = re.search(pattern, log)
        if not m:
            raise RuntimeError(f"llama-perplexity printed no {key!r} figure; its log ends:\n"
                               f"{log[-2000:]}")
        found[key] = float(m.group(1))
    m = re.search(r"(?:computing|calculating perplexity) over (\d+) chunks, n_ctx=(\d+)", log)
    tokens = int(m.group(1)) * (int(m.group(2)) - 1 - int(m.group(2)) // 2) if m else 0
    return Cost(found["kld"], found["top1"] / 100, found["ln_ppl_ratio"], tokens)


def llama_cpp_costs(binary: str, files: list[str], reference: str, text: str, ctx: int,
                    threads: int, extra: list[str]) -> dict[str, Cost]:
    with tempfile.TemporaryDirectory() as tmp:
        text_file, base = Path(tmp) / "text.txt", Path(tmp) / "base.kld"
        text_file.write_text(text)
        common = [binary, "-f", str(text_file), "-c", str(ctx), "-b", str(ctx), "-t",
                  str(threads), *extra]
        subprocess.run([*common, "-m", reference, "--kl-divergence-base", str(base)], check=True,
                       capture_output=True, text=True)
        out = {}
        for f in files:
            run = subprocess.run([*common, "-m", f, "--kl-divergence-base", str(base),
                                  "--kl-divergence"], capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(f"llama-perplexity on {f} exited {run.returncode}: "
                                   f"{run.stderr[-2000:]}")
            out[f] = parse_kld_log(run.stdout + run.stderr)
    return out


def table(files: list[str], ours: dict[str, Cost], theirs: dict[str, Cost] | None) -> list[str]:
    head = ["| file | engine | scored tokens | mean KLD vs bf16 | top-1 agrees with bf16 "
            "| ln(PPL(Q)/PPL(bf16)) |", "|---|---|---|---|---|---|"]
    rows = []
    for f in files:
        for engine, costs in (("radixflow", ours), ("llama.cpp", theirs)):
            if costs is None:
                continue
            c = costs[f]
            rows.append(f"| {Path(f).name} | {engine} | {c.tokens} | {c.kld:.5f} | {c.top1:.1%} "
                        f"| {c.ln_ppl_ratio:+.5f} |")
    return head + rows
