"""When a request's output must end, whoever appended the token: stop token ids, stop strings
and regexes (found in the text the client gets), max_new_tokens and the context."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..detokenize import IncrementalDetokenizer
from ..messages import Finish

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from .req import Req


def new_stop_checker(tokenizer: PreTrainedTokenizerBase, req: Req) -> IncrementalDetokenizer:
    """The request's stop-string search. It decodes with the prompt as context, as the
    detokenizer does, so a stop string is found where the text the client gets has it."""
    s = req.sampling
    return IncrementalDetokenizer(tokenizer, stop=s.stop, stop_regex=s.stop_regex,
                                  skip_special_tokens=s.skip_special_tokens,
                                  spaces_between_special_tokens=s.spaces_between_special_tokens,
                                  prompt_ids=req.input_ids)


def check_stops(req: Req, token: int, context_len: int) -> Finish | None:
    """Stop ids and strings, max_new_tokens and the context, after `token` was appended."""
    params = req.sampling
    if token in params.stop_token_ids:
        return Finish(type="stop", matched=token)
    if req.stop_checker is not None:
        req.stop_checker.append([token])
        if req.stop_checker.matched_stop is not None:
            return Finish(type="stop", matched=req.stop_checker.matched_stop)
        if req.stop_checker.error is not None:  # a stop_regex too slow to search
            return Finish(type="abort", message=req.stop_checker.error, status_code=400)
    if req.num_tokens_left <= 0:
        return Finish(type="length", length=params.max_new_tokens)
    if req.seq_len >= context_len:
        return Finish(type="length", length=len(req.output_ids))
    return None
