"""ReqTokenOut: what one request has to report after a scheduler step (a delta).

The detokenizer learns everything from these: a request's first output carries how to decode
it (DecodeSpec), and each output of a request with stop strings or regexes carries how much of
its text may be shown (`text_len`), read off the stop check the scheduler runs anyway
(`req.stop_checker`, an IncrementalDetokenizer that decodes as the detokenizer does).
"""

from __future__ import annotations

from ..detokenize import PROMPT_CONTEXT_TOKENS
from ..messages import DecodeSpec, ReqTokenOut
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
        decode=None if req.announced else decode_spec(req), text_len=_text_len(req, end),
        embedding=req.embedding, spec=req.spec.report() if req.spec is not None else None,
        **input_logprobs)
    req.pending_logprobs, req.pending_top_logprobs = [], []
    req.announced = True
    return out


def decode_spec(req: Req) -> DecodeSpec:
    """How the detokenizer decodes the request's tokens: as its stop checker does."""
    params = req.sampling
    return DecodeSpec(context_ids=req.input_ids[-PROMPT_CONTEXT_TOKENS:],
                      skip_special_tokens=params.skip_special_tokens,
                      spaces_between_special_tokens=params.spaces_between_special_tokens)


def _text_len(req: Req, end: int) -> int | None:
    """How much of the text of output_ids[:end] the client may see; None: no stops to cut at.

    Before the finish, the text the stop checker had after token `end` (a jumping request
    holds its last tokens back, and a jump may still rewrite them). At the finish, all of it:
    the tokens that ended the request unchecked (an EOS) are searched too, and a matched stop
    stays in the text with no_stop_trim."""
    checker = req.stop_checker
    if checker is None:
        return None
    if req.finish is None:
        return checker.text_len_at(end)
    checker.finish_with(req.output_ids)
    if req.sampling.no_stop_trim and checker.matched_end is not None:
        return checker.matched_end
    return len(checker.text)


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
