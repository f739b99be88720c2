"""SGLang-compatible native `/generate`: a body into GenerateReqs, and the /get_model_info body.

Shared by the HTTP server and the in-process Engine, so both speak exactly one wire format
(shared/protocol/sglang-native-api.md). `parse_generate` turns a body into `GenerateReq`s (one
per prompt and sample), reading its fields with native_fields and session_requests; a
`ResponseBuilder` (response_builder.py) per request turns the `ReqTextOut`s that come back
into the response object (non-stream) or into stream events.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest
from .messages import GenerateReq
from .native_fields import (
    check_fields,
    check_reasoning,
    logprob_window,
    opt_bool,
    prompt_sources,
    request_ids,
    sampling_list,
    tokenize_sources,
    with_thinking_cap,
)
from .native_placement import placement
from .reasoning import ReasoningParser
from .request_building import check_constraint, check_prompt_count, fit_to_context, new_rid
from .response_builder import ResponseBuilder
from .session_requests import parse_session_params
from .speculation_fields import speculation_fields


@dataclass
class ParsedGenerate:
    """A validated /generate body: `reqs` in response order (prompt-major, then sample)."""

    reqs: list[GenerateReq]
    is_batch: bool  # respond with an array: the prompt was a list, or n > 1
    stream: bool
    return_text_in_logprobs: bool
    reasoning: ReasoningParser | None = None  # the server's, for separate_reasoning

    def builders(self, tokenizer: Any) -> list[ResponseBuilder]:
        return [
            ResponseBuilder(
                req, tokenizer, return_text_in_logprobs=self.return_text_in_logprobs,
                index=i if self.is_batch else None, reasoning=self.reasoning,
            )
            for i, req in enumerate(self.reqs)
        ]

    def response(self, results: list[dict]) -> dict | list[dict]:
        """The non-stream body from one result per request, in `reqs` order."""
        return results if self.is_batch else results[0]


def parse_generate(
    body: Any, tokenizer: Any, context_length: int, *, vocab_size: int | None = None,
    reasoning: ReasoningParser | None = None, max_prompts: int | None = None,
    priority_scheduling: bool = False, sampling_defaults: Mapping[str, Any] | None = None,
) -> ParsedGenerate:
    """Validate a /generate body and build its GenerateReqs.

    Raises InvalidRequest (or ContextTooLong) naming the offending field: a top-level key that
    is not a /generate field (native_fields.SERVED_FIELDS), or one of SGLang's that radixflow
    does not implement (REFUSED_FIELDS), is a 400 as an unknown sampling key is (SGLang's
    frontend sends only served fields). `priority_scheduling`: the server runs with
    --enable-priority-scheduling (else a `priority` is a 400). `max_prompts`
    (--max-prompts-per-request): the most requests (prompts x n) one body may make.
    `sampling_defaults`: the model's (model_info's default_sampling_params), for the options
    a request leaves unset. Tokenizes and checks constraints, which may take a while on a
    large body: servers call it off the event loop.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if vocab_size is None:
        vocab_size = len(tokenizer)
    check_fields(body)
    sources, is_batch, param = prompt_sources(body, vocab_size)
    # Counted before any tokenizing: a batch past the cap costs no work.
    check_prompt_count(len(sources), 1, max_prompts, param=param)
    samplings = with_thinking_cap(body, sampling_list(body, len(sources), sampling_defaults))
    check_prompt_count(len(sources), [s.n for s in samplings], max_prompts, param=param)
    prompts = tokenize_sources(sources, is_batch, param, tokenizer)
    constraints = []
    for sampling in samplings:
        sampling.check_vocab(vocab_size)
        constraints.append(check_constraint(sampling))
    rids = request_ids(body, len(prompts), is_batch)
    session = parse_session_params(body.get("session_params"))
    stream = opt_bool(body, "stream")
    separate_reasoning = check_reasoning(body, samplings, reasoning)
    return_logprob = opt_bool(body, "return_logprob")
    return_text = opt_bool(body, "return_text_in_logprobs")
    start, top_n = logprob_window(body, return_logprob)
    where = placement(body, priority_scheduling=priority_scheduling)
    where.update(speculation_fields(body, tokenizer))

    reqs: list[GenerateReq] = []
    multi = is_batch or any(s.n > 1 for s in samplings)
    if session is not None and multi:
        raise InvalidRequest("session_params applies to a single prompt with n=1 (a batch or "
                             "n > 1 would add several requests to the session at once)",
                             param="session_params")
    for ids, sampling, constraint, rid in zip(prompts, samplings, constraints, rids,
                                             strict=True):
        if start > len(ids):
            raise InvalidRequest(f"logprob_start_len ({start}) is greater than the prompt "
                                 f"length ({len(ids)})", param="logprob_start_len")
        sampling = fit_to_context(sampling, len(ids), context_length, strict=False)
        n = sampling.n
        one = dataclasses.replace(sampling, n=1)
        for k in range(n):
            req_rid = new_rid() if rid is None else rid if n == 1 else f"{rid}-{k}"
            # n samples with one seed must still differ: sample k draws from seed + k
            seed = None if one.seed is None else one.seed + k
            reqs.append(GenerateReq(
                rid=req_rid, input_ids=ids, sampling=dataclasses.replace(one, seed=seed),
                return_logprob=return_logprob, logprob_start_len=start,
                top_logprobs_num=top_n, stream=stream, session=session,
                reasoning=separate_reasoning, constraint=constraint, **where))
    return ParsedGenerate(reqs=reqs, is_batch=multi, stream=stream,
                          return_text_in_logprobs=return_text, reasoning=reasoning)


def describe_model(model_info: dict, tokenizer: Any, **extra: Any) -> dict:
    """The /get_model_info body: the scheduler's model_info, the tokenizer's chat template and
    special tokens (what a client needs to render chat turns itself), and `extra` fields."""
    info = {**model_info, "is_generation": model_info.get("embedding") is None,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "bos_token": getattr(tokenizer, "bos_token", None),
            "eos_token": getattr(tokenizer, "eos_token", None)}
    info.update({k: v for k, v in extra.items() if v is not None})
    info.setdefault("tokenizer_path", info.get("model_path"))
    return info
