"""OpenAI request bodies -> GenerateReqs: validation, prompts, sampling options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequest, ModelNotFound
from ..messages import GenerateReq
from ..native_api import check_constraint, fit_to_context, new_rid, tokenize_prompt
from ..reasoning import ReasoningParser
from ..sampling_params import SamplingParams
from .openai_constraints import constraint_fields
from .openai_protocol import ChatCompletionRequest, CompletionRequest
from .openai_tools import ToolPlan, with_tools
from .responses import validation_error
from .scheduler_client import SchedulerClient
from .tool_parsers import ToolParser

AnyRequest = CompletionRequest | ChatCompletionRequest


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
    if body.model not in model_names:
        raise ModelNotFound(f"the model {body.model!r} does not exist; this server serves "
                            f"{served_model_name!r}")
    return body

def completion_job(client: SchedulerClient, body: CompletionRequest) -> Job:
    if body.suffix:
        raise InvalidRequest("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequest("best_of must equal n (or be omitted)", param="best_of")
    if body.echo and body.stream:
        raise InvalidRequest("echo is not supported with stream", param="echo")
    ids_list, texts = _completion_prompts(client, body.prompt)
    return _build_job(client, body, ids_list, texts, body.max_tokens, logprobs=body.logprobs,
                      echo=body.echo)


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
             tool_parser: ToolParser | None = None) -> Job:
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    text = render_chat(client.tokenizer, body, tools, tool_parser)
    if tools is not None and tools.parser.special_text:
        # the format's markers are special tokens: the text must keep them to be parsed
        body = body.model_copy(update={"skip_special_tokens": False})
    ids = client.tokenizer.encode(text, add_special_tokens=False)
    max_tokens = body.max_completion_tokens or body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.thinking_budget is not None and client.reasoning is None:
        raise InvalidRequest("thinking_budget needs a server started with --reasoning-parser",
                             param="thinking_budget")
    reasoning = client.reasoning if body.separate_reasoning else None
    return _build_job(client, body, [ids], [text], max_tokens, logprobs=logprobs,
                      constraint=tools.sampling_fields() if tools else None,
                      reasoning=reasoning)


def _sampling(body: AnyRequest, max_tokens: int | None, choice: int,
              constraint: dict | None = None) -> SamplingParams:
    d: dict[str, Any] = {
        "temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
        "min_p": body.min_p, "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty, "repetition_penalty": body.repetition_penalty,
        "stop": body.stop, "stop_token_ids": body.stop_token_ids, "ignore_eos": body.ignore_eos,
        "min_new_tokens": body.min_tokens, "skip_special_tokens": body.skip_special_tokens,
        "no_stop_trim": body.no_stop_trim, "logit_bias": body.logit_bias,
        "budget_safe": body.budget_safe, "max_repeat_run": body.max_repeat_run,
        "thinking_budget": getattr(body, "thinking_budget", None),
        **constraint_fields(body, constraint),
    }
    if max_tokens is not None:
        d["max_new_tokens"] = max_tokens
    if body.seed is not None:
        # Every choice gets its own stream of randomness, reproducible from the seed.
        d["seed"] = (body.seed + choice) % (1 << 63)
    sampling = SamplingParams.from_dict(d)
    check_constraint(sampling)  # a bad schema is a 400 here, before the scheduler
    return sampling


def _build_job(client: SchedulerClient, body: AnyRequest,
               prompts: list[list[int]], prompt_texts: list[str], max_tokens: int | None, *,
               logprobs: int | None, echo: bool = False,
               constraint: dict | None = None, reasoning: ReasoningParser | None = None) -> Job:
    reqs = []
    for p, ids in enumerate(prompts):
        if not ids:
            raise InvalidRequest("the prompt is empty (it has no tokens)", param="prompt")
        explicit = max_tokens is not None
        room = client.context_length - len(ids)
        for j in range(body.n):
            sampling = _sampling(body, max_tokens if explicit else max(room, 0), p * body.n + j,
                                 constraint)
            sampling = fit_to_context(sampling, len(ids), client.context_length, strict=explicit)
            sampling.check_vocab(client.vocab_size)
            reqs.append(GenerateReq(
                rid=new_rid(), input_ids=ids, sampling=sampling,
                return_logprob=logprobs is not None, logprob_start_len=0 if echo else -1,
                top_logprobs_num=logprobs or 0, stream=body.stream,
                reasoning=reasoning is not None))
    return Job(reqs=reqs, prompts=prompts, prompt_texts=prompt_texts, n=body.n,
               reasoning=reasoning)


def render_chat(tokenizer: Any, body: ChatCompletionRequest, tools: ToolPlan | None = None,
                tool_parser: ToolParser | None = None) -> str:
    """The prompt text: the model's chat template applied to the messages (and tools; past
    tool calls in `tool_parser`'s format)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("this model has no chat template; use /v1/completions",
                             param="messages")
    messages = []
    for m in body.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name is not None:
            msg["name"] = m.name
        messages.append(msg)
    messages, tool_kwargs = with_tools(tokenizer, messages, body.messages, tools, tool_parser)
    continue_final = body.continue_final_message
    if continue_final and body.messages[-1].role != "assistant":
        raise InvalidRequest("continue_final_message needs a final assistant message",
                             param="continue_final_message")
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False,
            add_generation_prompt=body.add_generation_prompt and not continue_final,
            continue_final_message=continue_final, **tool_kwargs,
            **(body.chat_template_kwargs or {}))
    except InvalidRequest:
        raise
    except Exception as exc:  # noqa: BLE001 -- any template error (jinja, raise_exception)
        raise InvalidRequest(f"the chat template rejected the messages: {exc}",
                             param="messages") from None
