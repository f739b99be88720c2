"""What every generation surface (the native /generate, the OpenAI routes) does alike when it
builds its GenerateReqs, so both refuse the same requests with the same messages: a fresh rid,
a prompt's token ids, the generation count cap, the fit in the context, the constraint through
the front door.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from .constrained import Constraint, prepare
from .errors import ContextTooLong, InvalidRequest
from .sampling_params import SamplingParams


def new_rid() -> str:
    return uuid.uuid4().hex


def tokenize_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a prompt that is already rendered: special-token strings become their ids.

    The tokenizer's own post-processor decides about BOS (Llama 3 adds one, ChatML models do
    not); if the text already starts with the BOS string, the extra BOS is dropped.
    """
    ids = list(tokenizer.encode(text, add_special_tokens=True))
    bos_id, bos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "bos_token", None)
    if (bos_id is not None and bos and len(ids) >= 2 and ids[0] == ids[1] == bos_id
            and text.startswith(bos)):
        ids = ids[1:]
    return ids


def fit_to_context(
    sampling: SamplingParams, prompt_len: int, context_length: int, *, strict: bool
) -> SamplingParams:
    """Check the prompt fits; cap max_new_tokens at what is left of the context.

    strict: an explicit max_new_tokens that does not fit is an error (OpenAI behaviour);
    otherwise it is clipped (SGLang behaviour for /generate).
    """
    if prompt_len >= context_length:
        raise ContextTooLong(
            f"the prompt has {prompt_len} tokens; it must be shorter than the model's context "
            f"length of {context_length} tokens", param="prompt")
    room = context_length - prompt_len
    if sampling.max_new_tokens <= room:
        return sampling
    if strict:
        raise ContextTooLong(
            f"this model's maximum context length is {context_length} tokens, but "
            f"{prompt_len + sampling.max_new_tokens} were requested ({prompt_len} in the prompt, "
            f"{sampling.max_new_tokens} for the completion)", param="max_tokens")
    return dataclasses.replace(
        sampling, max_new_tokens=room, min_new_tokens=min(sampling.min_new_tokens, room))


def check_constraint(sampling: SamplingParams) -> Constraint | None:
    """The request's constraint through the front door (constrained.prepare): checked,
    rewritten and normalised for the scheduler to compile as it is; GrammarError (a 400) for
    an invalid or too big regex / JSON Schema / EBNF / choices / structural tag. (Compile
    errors that only xgrammar finds come back as an abort with status_code 400.) Cached: a
    repeated constraint costs a lookup. Thread-safe; call it off the loop."""
    return None if sampling.constraint is None else prepare(*sampling.constraint)


def check_prompt_count(num_prompts: int, n: int | list[int], max_prompts: int | None, *,
                       param: str) -> None:
    """A 400 when one call asks for more generations (prompts x n) than
    --max-prompts-per-request allows. `n`: one n for every prompt, or each prompt's n."""
    if max_prompts is None:
        return
    total = sum(n) if isinstance(n, list) else num_prompts * n
    if total <= max_prompts:
        return
    what = (f"{num_prompts} prompts" if isinstance(n, list) or n == 1
            else f"{num_prompts} prompt(s) x n={n}")
    raise InvalidRequest(f"this request asks for {total} generations ({what}); the limit is "
                         f"{max_prompts} (--max-prompts-per-request)", param=param)
