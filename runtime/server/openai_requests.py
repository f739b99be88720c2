"""OpenAI request bodies -> GenerateReqs: validation (OpenAI's refused fields by name,
openai_fields.py), prompts, sampling options, reasoning_effort, and when and where each
request runs (native_placement.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequest, ModelNotFound
from ..messages import GenerateReq
from ..model_loader.generation_defaults import defaults_of
from ..native_placement import placement
from ..reasoning import ReasoningParser
from ..request_building import (
    check_constraint,
    check_prompt_count,
    fit_to_context,
    new_rid,
    tokenize_prompt,
)
from ..sampling_params import SamplingParams
from ..speculation_fields import speculation_fields
from .build_limits import NO_LIMITS, RENDER_TIMEOUT, BuildLimits
from .chat_render import render_chat, template_variables
from .openai_constraints import constraint_fields
from .openai_fields import CHAT_FIELDS, COMPLETION_FIELDS, check_refused, effort_update
from .openai_protocol import ChatCompletionRequest, CompletionRequest, sampling_names
from .openai_tools import ToolPlan
from .responses import validation_error
from .scheduler_client import SchedulerClient
from .tool_parsers import ToolParser

AnyRequest = CompletionRequest | ChatCompletionRequest
# (BuildLimits and render_chat live in build_limits.py and chat_render.py; importers of this
# module keep finding them here)
__all__ = ["NO_LIMITS", "RENDER_TIMEOUT", "BuildLimits", "Job", "chat_job", "completion_job",
           "render_chat", "requested_sampling", "template_variables", "validate_body"]
_FIELDS = {ChatCompletionRequest: CHAT_FIELDS, CompletionRequest: COMPLETION_FIELDS}


@dataclass
class Job:
    """One OpenAI request turned into GenerateReqs: choice i is reqs[i]."""

    reqs: list[GenerateReq]
    prompts: list[list[int]]  # one per distinct prompt; choice i uses prompts[i // n]
    prompt_texts: list[str]
    n: int
    reasoning: ReasoningParser | None = None  # chat with --reasoning-parser: it separates

    @property
    def stream(self) -> bool:
        return self.reqs[0].stream


def validate_body(raw: Any, model: type[BaseModel], *, served_model_name: str,
                  model_names: set[str]) -> Any:
    """`raw` (parsed JSON) as a `model` instance; its `model` field must be in `model_names`."""
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object")
    try:
        body = model.model_validate(raw, strict=None)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    if type(body) in _FIELDS:  # OpenAI's fields this server refuses (openai_fields.py)
        check_refused(body, _FIELDS[type(body)])
    if body.model not in model_names:
        raise ModelNotFound(f"the model {body.model!r} does not exist; this server serves "
                            f"{served_model_name!r}")
    return body

def completion_job(client: SchedulerClient, body: CompletionRequest,
                   limits: BuildLimits = NO_LIMITS) -> Job:
    """The GenerateReqs of a completions body: tokenizes and checks constraints, so servers
    call it off the event loop."""
    if body.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
    if body.echo and body.stream:
        raise InvalidRequest("echo is not supported with stream", param="echo")
    check_prompt_count(_num_prompts(body.prompt), body.n, limits.max_prompts,
                       param="prompt" if body.n == 1 else "n")
    ids_list, texts = _completion_prompts(client, body.prompt)
    return _build_job(client, body, ids_list, texts, limits, logprobs=body.logprobs,
                      echo=body.echo)


def _num_prompts(prompt: Any) -> int:
    """How many prompts a completions `prompt` holds (one string or one list of ids: 1)."""
    if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
        return 1
    return len(prompt)


def _completion_prompts(client: SchedulerClient, prompt: Any) -> tuple[list[list[int]], list[str]]:
    """(token ids, text) of each prompt: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        texts = [prompt]
    elif prompt and all(isinstance(p, str) for p in prompt):
        texts = list(prompt)
    elif prompt and all(isinstance(p, int) for p in prompt):
        texts, prompt = [None], [prompt]
    else:
        texts = [None] * len(prompt)
    if not texts:
        raise InvalidRequest("prompt must not be empty", param="prompt")
    ids_list: list[list[int]] = []
    for k, text in enumerate(texts):
        if text is not None:
            ids_list.append(tokenize_prompt(client.tokenizer, text))
            continue
        ids = list(prompt[k])
        if any(not 0 <= t < client.vocab_size for t in ids):
            raise InvalidRequest(f"prompt holds a token id outside [0, {client.vocab_size})",
                                 param="prompt")
        ids_list.append(ids)
    prompt_texts = [t if t is not None else client.tokenizer.decode(ids)
                    for t, ids in zip(texts, ids_list, strict=True)]
    return ids_list, prompt_texts


def chat_job(client: SchedulerClient, body: ChatCompletionRequest, tools: ToolPlan | None,
             tool_parser: ToolParser | None = None, limits: BuildLimits = NO_LIMITS) -> Job:
    """The GenerateReqs of a chat body: renders the template, tokenizes and checks
    constraints, so servers call it off the event loop."""
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    check_prompt_count(1, body.n, limits.max_prompts, param="n")
    if client.reasoning is not None:  # else reasoning_effort is a no-op
        body = body.model_copy(update=effort_update(
            body, getattr(client.tokenizer, "chat_template", None)))
    text = render_chat(client.tokenizer, body, tools, tool_parser, limits)
    if tools is not None and tools.parser.special_text:
        # the format's markers are special tokens: the text must keep them to be parsed
        body = body.model_copy(update={"skip_special_tokens": False})
    ids = client.tokenizer.encode(text, add_special_tokens=False)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.thinking_budget is not None and client.reasoning is None:
        raise InvalidRequest("thinking_budget needs a server started with --reasoning-parser",
                             param="thinking_budget")
    reasoning = client.reasoning if body.separate_reasoning else None
    return _build_job(client, body, [ids], [text], limits, logprobs=logprobs,
                      constraint=tools.sampling_fields() if tools else None,
                      reasoning=reasoning)


def requested_sampling(body: AnyRequest) -> dict[str, Any]:
    """The sampling options `body` sets, by SamplingParams' names (its sampling_names)."""
    options: dict[str, Any] = {}
    for name, option in sampling_names(type(body)).items():
        value = getattr(body, name)
        if value is not None:
            options[option] = value
    return options


def _sampling(client: SchedulerClient, body: AnyRequest, requested: dict[str, Any],
              choice: int, room: int, constraint: dict | None = None) -> SamplingParams:
    """Choice `choice`'s SamplingParams; without max_tokens it may fill the `room` left."""
    d = {"max_new_tokens": max(room, 0), **requested, **constraint_fields(body, constraint),
         "n": 1}  # the body's n choices are n requests of one sample each
    if "seed" in d:
        # Every choice gets its own stream of randomness, reproducible from the seed.
        d["seed"] = (d["seed"] + choice) % (1 << 63)
    # the model's sampling defaults (--sampling-defaults) for what the body leaves unset
    sampling = SamplingParams.from_dict(d, defaults_of(getattr(client, "model_info", None)))
    check_constraint(sampling)  # a bad schema is a 400 here, before the scheduler
    return sampling


def _build_job(client: SchedulerClient, body: AnyRequest, prompts: list[list[int]],
               prompt_texts: list[str], limits: BuildLimits, *, logprobs: int | None,
               echo: bool = False, constraint: dict | None = None,
               reasoning: ReasoningParser | None = None) -> Job:
    where = placement(body, priority_scheduling=limits.priority_scheduling, openai=True)
    where.update(speculation_fields(body, client.tokenizer))
    requested = requested_sampling(body)
    explicit = "max_new_tokens" in requested
    reqs = []
    for p, ids in enumerate(prompts):
        if not ids:
            raise InvalidRequest("the prompt is empty (it has no tokens)", param="prompt")
        room = client.context_length - len(ids)
        for j in range(body.n):
            sampling = _sampling(client, body, requested, p * body.n + j, room, constraint)
            sampling = fit_to_context(sampling, len(ids), client.context_length, strict=explicit)
            sampling.check_vocab(client.vocab_size)
            reqs.append(GenerateReq(
                rid=new_rid(), input_ids=ids, sampling=sampling,
                return_logprob=logprobs is not None, logprob_start_len=0 if echo else -1,
                top_logprobs_num=logprobs or 0, stream=body.stream,
                reasoning=reasoning is not None, **where,
                constraint=check_constraint(sampling)))  # (prepared in _sampling: a hit)
    return Job(reqs=reqs, prompts=prompts, prompt_texts=prompt_texts, n=body.n,
               reasoning=reasoning)
