"""The fields of a native /generate body, each read and checked on its own: a 400 names the
field at fault. native_api.parse_generate reads them in a fixed order (the first fault found is
the one reported) and builds the GenerateReqs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import InvalidRequest
from .reasoning import ReasoningParser
from .request_building import tokenize_prompt
from .sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 100

# Every top-level field /generate serves: SGLang's GenerateReqInput fields it implements
# (python/sglang/srt/managers/io_struct.py), and what each does here. Any other key is a 400.
SERVED_FIELDS: dict[str, str] = {
    "text": "the prompt: a string, or a list of strings (a batch)",
    "input_ids": "the prompt as token ids: a list of ints, or a list of such lists",
    "sampling_params": "an object, or one per prompt (runtime/sampling_params.py)",
    "rid": "the request id (a list of distinct ids for a batch); /abort_request takes it",
    "stream": "server-sent events",
    "return_logprob": "logprobs of the prompt (from logprob_start_len) and the output",
    "logprob_start_len": "the first prompt position scored",
    "top_logprobs_num": f"the top alternatives per position (at most {MAX_TOP_LOGPROBS})",
    "return_text_in_logprobs": "fill the token text of each logprob entry",
    "session_params": "continue a request of a session",
    "separate_reasoning": "the thinking in meta_info.reasoning_text (--reasoning-parser)",
    "max_thinking_tokens": "sampling_params.thinking_budget for every prompt",
    "priority": "lower first; needs --enable-priority-scheduling",
    "cache_salt": "the request's radix cache namespace",
    "routed_dp_rank": "the --dp-size replica that serves the request",
    "data_parallel_rank": "SGLang's deprecated name of routed_dp_rank",
    "log_metrics": "accepted, no effect: /metrics counts every request",
    "no_logs": "accepted: radixflow logs no prompt or output text anyway",
    "conversation_id": "accepted, no effect (SGLang's tracking label)",
    "speculative": "speculative decoding on (true) or off (false) for these requests; unset: "
                   "--speculative-algorithm decides",
    "prediction": "the text the output is expected to be (OpenAI's Predicted Outputs): "
                  "drafted first, so the matching parts cost fewer decode steps",
}

# SGLang /generate fields radixflow does not implement, each with why: a body that sets one is
# refused (400 naming it) rather than served as if it had not been asked. Null, false and
# SGLang's default (0 for routed_experts_start_len) mean unset.
_MEDIA = "radixflow serves text models only"
_PD = "radixflow has no prefill/decode disaggregation"
REFUSED_FIELDS: dict[str, str] = {
    "input_embeds": "prompts are text or input_ids",
    "image_data": _MEDIA, "video_data": _MEDIA, "audio_data": _MEDIA,
    "mm_hashes": _MEDIA, "mm_content_hashes": _MEDIA, "use_audio_in_video": _MEDIA,
    "video_config": _MEDIA, "modalities": _MEDIA, "max_dynamic_patch": _MEDIA,
    "min_dynamic_patch": _MEDIA, "image_max_dynamic_patch": _MEDIA,
    "video_max_dynamic_patch": _MEDIA, "images_config": _MEDIA,
    "need_wait_for_mm_inputs": _MEDIA, "num_items_assigned": _MEDIA,
    "encoder_urls": _MEDIA, "return_bytes": _MEDIA,
    "token_ids_logprob": "logprobs of chosen token ids are not computed; use top_logprobs_num",
    "return_sampling_mask": "the sampling support is not returned",
    "return_flat_raw_top_logprobs": "logprobs come as [logprob, id, text] lists only",
    "return_flat_raw_top_logprobs_b64": "logprobs come as [logprob, id, text] lists only",
    "return_hidden_states": "hidden states are not returned (embeddings: /v1/embeddings)",
    "return_routed_experts": "radixflow runs no mixture-of-experts routing capture",
    "routed_experts_start_len": "radixflow runs no mixture-of-experts routing capture",
    "return_indexer_topk": "radixflow has no sparse-attention indexer",
    "return_entropy": "per-token entropy is not computed",
    "return_prompt_token_ids": "not returned; POST /tokenize gives a prompt's ids",
    "lora_path": "radixflow serves no LoRA adapters",
    "lora_id": "radixflow serves no LoRA adapters",
    "custom_logit_processor": "custom logit processors (serialized Python) are not run",
    "positional_embed_overrides": "prompts are text or input_ids",
    "multi_item_delimiter_indices": "multi-item scoring is not implemented",
    "bootstrap_host": _PD, "bootstrap_port": _PD, "bootstrap_room": _PD,
    "bootstrap_pair_key": _PD, "decode_tp_size": _PD, "disagg_prefill_dp_rank": _PD,
    "kv_router_hint": _PD,
    "session_id": "SGLang's streaming-session identity is not implemented; use session_params",
    "routing_key": "there is no routing-key schedule policy; use routed_dp_rank",
    "extra_key": "use cache_salt for a cache namespace",
    "require_reasoning": "use sampling_params.thinking_budget or the chat template",
    "background": "background requests are /v1/responses' (background is refused there too)",
    "custom_labels": "/metrics has no per-request labels",
    "external_trace_header": "radixflow does no request tracing",
    "received_time": "set by SGLang's own server, not by clients",
    "http_worker_ipc": "internal to SGLang's server",
}
_DEFAULTS: dict[str, Any] = {"routed_experts_start_len": 0}
# (kept under its old name for callers that list the refused fields)
UNSUPPORTED_FIELDS = tuple(REFUSED_FIELDS)


def check_fields(body: dict) -> None:
    """A 400 naming the first key that is not a /generate field, or that asks for what
    radixflow does not do."""
    for key, value in body.items():
        if key in SERVED_FIELDS:
            continue
        if key not in REFUSED_FIELDS:
            raise InvalidRequest(f"unknown field {key!r}: /generate takes SGLang's "
                                 "GenerateReqInput fields (docs/server-api.md lists them)",
                                 param=key)
        if not _is_unset(value, _DEFAULTS.get(key)):
            raise InvalidRequest(f"{key} is not supported: {REFUSED_FIELDS[key]}", param=key)


def _is_unset(value: Any, default: Any) -> bool:
    if value is None or value is False or value == default:
        return True
    return isinstance(value, (list, dict, str)) and not value


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


def sampling_list(body: dict, num_prompts: int,
                  defaults: Mapping[str, Any] | None = None) -> list[SamplingParams]:
    """One SamplingParams per prompt; `defaults`: the model's sampling defaults, for the
    options a prompt's sampling_params leaves unset."""
    raw = body.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != num_prompts:
            raise InvalidRequest(f"sampling_params is a list of {len(raw)} but there are "
                                 f"{num_prompts} prompts", param="sampling_params")
        return [SamplingParams.from_dict(d, defaults) for d in raw]
    params = SamplingParams.from_dict(raw, defaults)
    return [dataclasses.replace(params) for _ in range(num_prompts)]


def with_thinking_cap(body: dict, samplings: list[SamplingParams]) -> list[SamplingParams]:
    """SGLang's top-level `max_thinking_tokens`: the thinking_budget of every sampling that
    sets none (one that sets another value is a 400)."""
    cap = body.get("max_thinking_tokens")
    if cap is None:
        return samplings
    try:  # the budget's own type and range
        SamplingParams.from_dict({"thinking_budget": cap})
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message.replace("thinking_budget", "max_thinking_tokens"),
                             param="max_thinking_tokens") from None
    if any(s.thinking_budget not in (None, cap) for s in samplings):
        raise InvalidRequest("max_thinking_tokens and sampling_params.thinking_budget differ; "
                             "give one", param="max_thinking_tokens")
    return [dataclasses.replace(s, thinking_budget=cap) for s in samplings]


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
