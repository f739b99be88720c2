"""ReqTokenOut: what one request has to report after a scheduler step (a delta)."""

from __future__ import annotations

from ..messages import ReqTokenOut
from .grammar import HOLD_BACK_TOKENS
from .req import Req


def make_output(req: Req) -> ReqTokenOut | None:
    """The request's news since its last output, or None if there is none."""
    end = len(req.output_ids)
    if req.can_jump and req.finish is None:
        end = max(req.sent_len, end - HOLD_BACK_TOKENS)
    interval = req.sampling.stream_interval
    if interval and req.finish is None and req.sent_len and end - req.sent_len < interval:
        return None  # stream_interval: the first token at once, then every `interval` tokens
    new_ids = req.output_ids[req.sent_len:end]
    req.sent_len = end
    input_logprobs = _input_logprob_fields(req)
    if not new_ids and req.finish is None and not input_logprobs:
        return None
    out = ReqTokenOut(
        rid=req.rid, new_ids=new_ids, prompt_tokens=len(req.input_ids),
        cached_tokens=req.cached_len, completion_tokens=len(req.output_ids),
        finish=req.finish,
        output_logprobs=req.pending_logprobs if req.return_logprob else None,
        output_top_logprobs=req.pending_top_logprobs if req.top_logprobs_num else None,
        **input_logprobs)
    req.pending_logprobs, req.pending_top_logprobs = [], []
    return out

def _input_logprob_fields(req: Req) -> dict:
    if not req.wants_input_logprobs or req.reported_input_logprobs:
        return {}
    if req.input_logprobs is None or req.computed_len < len(req.input_ids) and req.finish is None:
        return {}
    req.reported_input_logprobs = True
    fields = {"input_logprobs": req.input_logprobs,
              "input_ids": req.input_ids[req.logprob_start_len:]}
    if req.top_logprobs_num:
        fields["input_top_logprobs"] = req.input_top_logprobs
    return fields
