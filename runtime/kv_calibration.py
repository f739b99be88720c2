"""An int8 KV pool's key offsets (kernels/kv_int8.py's `key_offset`), calibrated at start-up.

One prefill of a fixed text, shaped as the requests a server sees (the tokenizer's chat
template around it where there is one, so its first token is what a chat request's is), runs
through the model as it will serve; the pool logs every key it is given, and each layer's
offset is set from them: the mean of its keys, moved so that the first token's key lands on the
int8 grid. Every tensor-parallel rank runs the same prefill (its collectives included) over
its own heads. The slots and the request row it used are handed back before the first request.

Skipped (offsets stay zero) where the offsets would change attention: scores that are not a
plain softmax's (Gemma 2's soft-capped ones).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

from ..kernels import kv_int8
from .forward_batch import BatchRequest, ForwardMode

if TYPE_CHECKING:
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)

MAX_TOKENS = 1024

SYSTEM = "You are a helpful assistant. Answer briefly and use the tools when they help."

TEXT = """\
Read the report below, then list every person it names with their role and the date they
joined, as JSON.

Quarterly report, third quarter. The Lisbon office opened on 4 July with twelve staff; Maria
Alves (operations lead, joined 2019-03-11) moved from Porto to run it. Revenue rose 14% to
$3.2 million, driven by the logistics contracts signed in May, while costs grew 6%. Daniel
Osei (finance, joined 2021-09-01) notes that two invoices, #4471 and #4480, are still unpaid.
The board approved the hiring plan: three engineers, one designer and a support manager by
the end of the year. Next steps: renew the warehouse lease, move the billing system to the
new provider, and review the travel policy ("economy for flights under six hours").

Example of the expected output:
{"people": [{"name": "Maria Alves", "role": "operations lead", "joined": "2019-03-11"},
            {"name": "Daniel Osei", "role": "finance", "joined": "2021-09-01"}]}

def total(invoices: list[dict]) -> float:
    # Sum the unpaid amounts, skipping credit notes.
    return sum(i["amount"] for i in invoices if i.get("status") == "unpaid" and i["amount"] > 0)

Q: What is the capital of Australia, and how far is it from Sydney?
A: Canberra, about 280 km (170 miles) south-west of Sydney by road.

1. Preheat the oven to 180 C. 2. Mix the flour, sugar and eggs. 3. Bake for 25 minutes.
"""


def calibration_ids(tokenizer: Any, max_tokens: int = MAX_TOKENS) -> list[int]:
    """The calibration text's token ids as the server makes a chat request's prompt (rendered
    by the chat template, encoded without special tokens); a completion prompt's (special
    tokens added) where the tokenizer has no chat template or its template refuses these
    messages."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEXT}]
    if getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
        except Exception as exc:  # noqa: BLE001 -- a template's own check (no system role)
            logger.debug("the chat template refused the calibration messages: %s", exc)
    return tokenizer.encode(TEXT)[:max_tokens]


def why_not(runner: ModelRunner) -> str | None:
    """Why this runner's pool keeps zero offsets, or None."""
    if not runner.kv_pool.is_int8:
        return "not an int8 KV cache"
    if runner.model_args.attn_softcap is not None:
        return "its attention scores are soft-capped (a shift of every key changes them)"
    return None


def calibrate(runner: ModelRunner, ids: list[int]) -> None:
    """Set runner.kv_pool.k_offsets from one prefill of `ids` (at least 2 tokens)."""
    pool, rows = runner.kv_pool, runner.req_to_token_pool
    n = min(len(ids), runner.context_len, pool.num_slots)
    if n < 2:
        raise ValueError(f"KV calibration needs at least 2 tokens, got {n}")
    started = time.perf_counter()
    row, slots = rows.alloc(), pool.alloc(n)
    if row is None or slots is None:
        raise RuntimeError("KV calibration found no free request row or KV slots at start-up")
    rows.req_to_token[row, :n] = slots.to(rows.req_to_token.dtype)
    log = pool.record_keys()
    try:
        runner.forward(ForwardMode.EXTEND, [BatchRequest(row, list(ids[:n]), 0, [n - 1])],
                       slots)
    finally:
        pool.stop_recording()
        pool.free(slots)
        rows.free(row)
    for layer, offset in enumerate(pool.k_offsets):
        keys = log.get(layer)
        if keys:  # (a layer without attention logs nothing and keeps zeros)
            offset.copy_(kv_int8.key_offset(torch.cat(keys)))
    logger.info("int8 KV cache: key offsets calibrated over %d tokens in %.2f s", n,
                time.perf_counter() - started)
