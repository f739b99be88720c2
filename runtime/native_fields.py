"""The fields of a native /generate body, each read and checked on its own: a 400 names the
field at fault. native_api.parse_generate reads them in a fixed order (the first fault found is
the one reported) and builds the GenerateReqs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import InvalidRequest
from .reasoning import ReasoningParser
from .request_building import tokenize_prompt
from .sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 100

# SGLang /generate fields radixflow does not implement: a body that sets one is refused (400
# naming it) rather than served as if it had not been asked. False and null mean unset.
UNSUPPORTED_FIELDS = ("lora_path", "custom_logit_processor", "return_hidden_states",
                      "token_ids_logprob")


def refuse_unsupported(body: dict) -> None:
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) is not None and body.get(key) is not False:
            raise InvalidRequest(f"{key} is not supported", param=key)


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def opt_bool(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be a boolean (got {value!r})", param=key)
    return value


def prompt_sources(body: dict, vocab_size: int) -> tuple[list[str] | list[list[int]], bool, str]:
    """The body's prompts, checked but not tokenized yet: (texts or token id lists, whether
    the body was a batch, the field they came in)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if body.get("input_embeds") is not None or body.get("image_data") is not None:
        raise InvalidRequest("only text and input_ids prompts are supported",
                             param="input_embeds" if body.get("input_embeds") is not None
                             else "image_data")
    if (text is None) == (input_ids is None):
        raise InvalidRequest("exactly one of 'text' and 'input_ids' must be given", param="text")
    if text is not None:
        if isinstance(text, str):
            return [text], False, "text"
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return list(text), True, "text"
        raise InvalidRequest("text must be a string or a non-empty list of strings",
                             param="text")
    if isinstance(input_ids, list) and input_ids and all(is_int(t) for t in input_ids):
        prompts, is_batch = [list(input_ids)], False
    elif (isinstance(input_ids, list) and input_ids
          and all(isinstance(p, list) and all(is_int(t) for t in p) for p in input_ids)):
        prompts, is_batch = [list(p) for p in input_ids], True
    else:
        raise InvalidRequest(
            "input_ids must be a non-empty list of ints or a list of such lists",
            param="input_ids")
    for p in prompts:
        bad = next((t for t in p if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"input_ids holds token id {bad}, outside the vocabulary "
                                 f"[0, {vocab_size})", param="input_ids")
    return prompts, is_batch, "input_ids"


def tokenize_sources(sources: list[str] | list[list[int]], is_batch: bool, param: str,
                     tokenizer: Any) -> list[list[int]]:
    prompts = [tokenize_prompt(tokenizer, s) if isinstance(s, str) else s for s in sources]
    for i, p in enumerate(prompts):
        if not p:
            where = f"prompt {i}" if is_batch else "the prompt"
            raise InvalidRequest(f"{where} is empty (it has no tokens)", param=param)
    return prompts


def sampling_list(body: dict, num_prompts: int) -> list[SamplingParams]:
    raw = body.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != num_prompts:
            raise InvalidRequest(f"sampling_params is a list of {len(raw)} but there are "
                                 f"{num_prompts} prompts", param="sampling_params")
        return [SamplingParams.from_dict(d) for d in raw]
    params = SamplingParams.from_dict(raw)
    return [dataclasses.replace(params) for _ in range(num_prompts)]


def request_ids(body: dict, num_prompts: int, is_batch: bool) -> list[str | None]:
    rid = body.get("rid")
    if rid is None:
        return [None] * num_prompts
    if not is_batch and isinstance(rid, str) and rid:
        return [rid]
    if (is_batch and isinstance(rid, list) and len(rid) == num_prompts
            and all(isinstance(r, str) and r for r in rid) and len(set(rid)) == len(rid)):
        return list(rid)
    raise InvalidRequest("rid must be a non-empty string (a list of distinct strings, one per "
                         "prompt, for a batch)", param="rid")


def logprob_window(body: dict, return_logprob: bool) -> tuple[int, int]:
    """(logprob_start_len, top_logprobs_num) as the scheduler takes them: (-1, 0) when the
    body asks for no logprobs."""
    top_n = body.get("top_logprobs_num")
    if top_n is None:
        top_n = 0
    if not is_int(top_n) or not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs_num must be an int in [0, {MAX_TOP_LOGPROBS}] "
                             f"(got {top_n!r})", param="top_logprobs_num")
    start = body.get("logprob_start_len")
    if start is not None and (not is_int(start) or start < -1):
        raise InvalidRequest(f"logprob_start_len must be an int >= -1 (got {start!r})",
                             param="logprob_start_len")
    if start is None:
        # input_ids requests asking for logprobs want the whole prompt scored (section 6.2).
        start = 0 if return_logprob and body.get("input_ids") is not None else -1
    if not return_logprob:
        start, top_n = -1, 0
    return start, top_n


def check_reasoning(body: dict, samplings: list[SamplingParams],
                    reasoning: ReasoningParser | None) -> bool:
    """The body's `separate_reasoning`; a 400 when it, or a thinking_budget, is given to a
    server without a reasoning parser."""
    separate = opt_bool(body, "separate_reasoning")
    if reasoning is None:
        if separate:
            raise InvalidRequest("separate_reasoning needs a server started with "
                                 "--reasoning-parser", param="separate_reasoning")
        if any(s.thinking_budget is not None for s in samplings):
            raise InvalidRequest("thinking_budget needs a server started with "
                                 "--reasoning-parser", param="thinking_budget")
    return separate
