"""SGLang-compatible native `/generate`: request parsing and response assembly.

Shared by the HTTP server and the in-process Engine, so both speak exactly one wire format
(shared/protocol/sglang-native-api.md). Parsing turns a body into `GenerateReq`s (one per
prompt and sample); a `ResponseBuilder` per request turns the `ReqTextOut`s that come back
into the response object (non-stream) or into stream events.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .constrained import Constraint, prepare
from .detokenize import decode_token_texts
from .errors import ContextTooLong, InvalidRequest, rejection
from .messages import CloseSessionReq, GenerateReq, OpenSessionReq, ReqTextOut, SessionParams
from .reasoning import ReasoningParser
from .sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 100
# JSON has no -inf; a logprob of a token the sampler could never pick is reported as this.
LOGPROB_FLOOR = -9999.0


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


# SGLang /generate fields radixflow does not implement: a body that sets one is refused (400
# naming it) rather than served as if it had not been asked. False and null mean unset.
UNSUPPORTED_FIELDS = ("lora_path", "custom_logit_processor", "return_hidden_states",
                      "token_ids_logprob")


def _refuse_unsupported(body: dict) -> None:
    for key in UNSUPPORTED_FIELDS:
        if body.get(key) is not None and body.get(key) is not False:
            raise InvalidRequest(f"{key} is not supported", param=key)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt_bool(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be a boolean (got {value!r})", param=key)
    return value


def _prompt_sources(body: dict, vocab_size: int) -> tuple[list[str] | list[list[int]], bool, str]:
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
    if isinstance(input_ids, list) and input_ids and all(_is_int(t) for t in input_ids):
        prompts, is_batch = [list(input_ids)], False
    elif (isinstance(input_ids, list) and input_ids
          and all(isinstance(p, list) and all(_is_int(t) for t in p) for p in input_ids)):
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


def _tokenize_sources(sources: list[str] | list[list[int]], is_batch: bool, param: str,
                      tokenizer: Any) -> list[list[int]]:
    prompts = [tokenize_prompt(tokenizer, s) if isinstance(s, str) else s for s in sources]
    for i, p in enumerate(prompts):
        if not p:
            where = f"prompt {i}" if is_batch else "the prompt"
            raise InvalidRequest(f"{where} is empty (it has no tokens)", param=param)
    return prompts


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


def _sampling_list(body: dict, num_prompts: int) -> list[SamplingParams]:
    raw = body.get("sampling_params")
    if isinstance(raw, list):
        if len(raw) != num_prompts:
            raise InvalidRequest(f"sampling_params is a list of {len(raw)} but there are "
                                 f"{num_prompts} prompts", param="sampling_params")
        return [SamplingParams.from_dict(d) for d in raw]
    params = SamplingParams.from_dict(raw)
    return [dataclasses.replace(params) for _ in range(num_prompts)]


def _rids(body: dict, num_prompts: int, is_batch: bool) -> list[str | None]:
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


SESSION_PARAMS_KEYS = ("id", "rid", "offset", "replace", "drop_previous_output")


def parse_session_params(value: Any) -> SessionParams | None:
    """A /generate body's `session_params` (SGLang's SessionParams); None when it names no
    session: absent, or an `id` of null (SGLang serves that as a request outside any session).
    Whether the session and `rid` exist is the scheduler's to say."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequest("session_params must be an object", param="session_params")
    unknown = [k for k in value if k not in SESSION_PARAMS_KEYS]
    if unknown:
        raise InvalidRequest(f"unknown session parameter {unknown[0]!r}; session_params takes "
                             f"{', '.join(SESSION_PARAMS_KEYS)}",
                             param=f"session_params.{unknown[0]}")
    sid, rid, offset = value.get("id"), value.get("rid"), value.get("offset")
    if sid is None:
        return None
    if not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_params.id must be a session id (a non-empty string) "
                             f"(got {sid!r})", param="session_params.id")
    if rid is not None and (not isinstance(rid, str) or not rid):
        raise InvalidRequest(f"session_params.rid must be the rid of a request of the session "
                             f"(a non-empty string) or null (got {rid!r})",
                             param="session_params.rid")
    if offset is not None and not _is_int(offset):
        raise InvalidRequest(f"session_params.offset must be an int or null (got {offset!r})",
                             param="session_params.offset")
    flags = {}
    for key in ("replace", "drop_previous_output"):
        flag = value.get(key)
        if flag is not None and not isinstance(flag, bool):
            raise InvalidRequest(f"session_params.{key} must be a boolean (got {flag!r})",
                                 param=f"session_params.{key}")
        flags[key] = bool(flag)
    return SessionParams(id=sid, rid=rid, offset=offset, **flags)


def parse_open_session(body: Any) -> OpenSessionReq:
    """An /open_session body (SGLang's OpenSessionReqInput: capacity_of_str_len, session_id,
    timeout, streaming) as the scheduler's message; a session id is made up when none is given.
    Unknown keys are ignored, as in /generate."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    capacity = body.get("capacity_of_str_len")
    if not _is_int(capacity) or capacity < 1:
        raise InvalidRequest(f"capacity_of_str_len must be an int >= 1: the most tokens one "
                             f"request of the session may hold, history included (got "
                             f"{capacity!r})", param="capacity_of_str_len")
    sid = body.get("session_id")
    if sid is None:
        sid = new_rid()
    elif not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_id must be a non-empty string or null (got {sid!r})",
                             param="session_id")
    timeout = body.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not 0 < timeout < math.inf):
        raise InvalidRequest(f"timeout must be a number of seconds > 0 or null (got "
                             f"{timeout!r})", param="timeout")
    streaming = body.get("streaming")
    if streaming is not None and not isinstance(streaming, bool):
        raise InvalidRequest(f"streaming must be a boolean (got {streaming!r})",
                             param="streaming")
    if streaming:
        raise InvalidRequest("streaming sessions (which keep the last request's KV for the next "
                             "one) are not supported; open a session without 'streaming': its "
                             "history's KV is reused from the prefix cache", param="streaming")
    return OpenSessionReq(session_id=sid, capacity_of_str_len=capacity,
                          timeout=None if timeout is None else float(timeout))


def parse_close_session(body: Any) -> CloseSessionReq:
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    sid = body.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise InvalidRequest(f"session_id must be a non-empty string (got {sid!r})",
                             param="session_id")
    return CloseSessionReq(session_id=sid)


def parse_generate(
    body: Any, tokenizer: Any, context_length: int, *, vocab_size: int | None = None,
    reasoning: ReasoningParser | None = None, max_prompts: int | None = None,
) -> ParsedGenerate:
    """Validate a /generate body and build its GenerateReqs.

    Raises InvalidRequest (or ContextTooLong) naming the offending field. Unknown top-level
    keys are ignored, as SGLang's frontend requires; unknown sampling keys are errors.
    `max_prompts` (--max-prompts-per-request): the most requests (prompts x n) one body may
    make. Tokenizes and checks constraints, which may take a while on a large body: servers
    call it off the event loop.
    """
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if vocab_size is None:
        vocab_size = len(tokenizer)
    _refuse_unsupported(body)
    sources, is_batch, param = _prompt_sources(body, vocab_size)
    # Counted before any tokenizing: a batch past the cap costs no work.
    check_prompt_count(len(sources), 1, max_prompts, param=param)
    samplings = _sampling_list(body, len(sources))
    check_prompt_count(len(sources), [s.n for s in samplings], max_prompts, param=param)
    prompts = _tokenize_sources(sources, is_batch, param, tokenizer)
    constraints = []
    for sampling in samplings:
        sampling.check_vocab(vocab_size)
        constraints.append(check_constraint(sampling))
    rids = _rids(body, len(prompts), is_batch)
    session = parse_session_params(body.get("session_params"))
    stream = _opt_bool(body, "stream")
    separate_reasoning = _check_reasoning(body, samplings, reasoning)
    return_logprob = _opt_bool(body, "return_logprob")
    return_text = _opt_bool(body, "return_text_in_logprobs")

    top_n = body.get("top_logprobs_num")
    if top_n is None:
        top_n = 0
    if not _is_int(top_n) or not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs_num must be an int in [0, {MAX_TOP_LOGPROBS}] "
                             f"(got {top_n!r})", param="top_logprobs_num")
    start = body.get("logprob_start_len")
    if start is not None and (not _is_int(start) or start < -1):
        raise InvalidRequest(f"logprob_start_len must be an int >= -1 (got {start!r})",
                             param="logprob_start_len")
    if start is None:
        # input_ids requests asking for logprobs want the whole prompt scored (section 6.2).
        start = 0 if return_logprob and body.get("input_ids") is not None else -1
    if not return_logprob:
        start, top_n = -1, 0

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
                reasoning=separate_reasoning, constraint=constraint))
    return ParsedGenerate(reqs=reqs, is_batch=multi, stream=stream,
                          return_text_in_logprobs=return_text, reasoning=reasoning)


def _check_reasoning(body: dict, samplings: list[SamplingParams],
                     reasoning: ReasoningParser | None) -> bool:
    """The body's `separate_reasoning`; a 400 when it, or a thinking_budget, is given to a
    server without a reasoning parser."""
    separate = _opt_bool(body, "separate_reasoning")
    if reasoning is None:
        if separate:
            raise InvalidRequest("separate_reasoning needs a server started with "
                                 "--reasoning-parser", param="separate_reasoning")
        if any(s.thinking_budget is not None for s in samplings):
            raise InvalidRequest("thinking_budget needs a server started with "
                                 "--reasoning-parser", param="thinking_budget")
    return separate


def finite_logprob(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else LOGPROB_FLOOR


class ResponseBuilder:
    """Assembles one request's /generate response from its ReqTextOuts.

    `add` every output as it arrives; `event()` gives a stream event covering everything
    added since the previous event (several queued outputs merge into one event);
    `result()` gives the non-stream object.
    """

    def __init__(self, req: GenerateReq, tokenizer: Any, *, return_text_in_logprobs: bool = False,
                 index: int | None = None, reasoning: ReasoningParser | None = None):
        self.req = req
        # separate_reasoning: `text` is the answer, meta_info the reasoning (text stays whole)
        self.reasoning = reasoning if req.reasoning else None
        self.reasoning_mode = reasoning.mode(req.input_ids) if self.reasoning else None
        self.tokenizer = tokenizer
        self.return_text = return_text_in_logprobs
        self.index = index
        self.start_time = time.monotonic()
        self.text = ""
        self.output_ids: list[int] = []
        self.prompt_tokens = len(req.input_ids)
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: dict | None = None
        self.closed_early = False  # budget-safe closing ended the output (Finish.closed_early)
        self.output_logprobs: list[list] = []
        self.output_top_logprobs: list[list | None] = []
        self.input_logprobs: list[list] = []
        self.input_top_logprobs: list[list | None] = []
        self._streamed_logprobs = 0  # output logprob entries already sent in events
        self._streamed_top = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _token_texts(self, ids: list[int]) -> list[str | None]:
        if not self.return_text or not ids:
            return [None] * len(ids)
        return list(decode_token_texts(self.tokenizer, ids))

    def _entries(self, logprobs: list[float | None], ids: list[int]) -> list[list]:
        texts = self._token_texts(ids)
        entries = zip(logprobs, ids, texts, strict=False)
        return [[finite_logprob(lp), tid, t] for lp, tid, t in entries]

    def _top_entries(self, tops: list[list[tuple[float, int]] | None]) -> list[list | None]:
        out: list[list | None] = []
        for top in tops:
            if top is None:
                out.append(None)
                continue
            ids = [int(tid) for _, tid in top]
            out.append(self._entries([lp for lp, _ in top], ids))
        return out

    def add(self, out: ReqTextOut) -> None:
        tok = out.token
        self.text = out.text
        self.output_ids.extend(tok.new_ids)
        self.prompt_tokens = tok.prompt_tokens
        self.cached_tokens = tok.cached_tokens
        self.completion_tokens = tok.completion_tokens
        if self.req.return_logprob:
            if tok.output_logprobs is not None:
                self.output_logprobs.extend(self._entries(tok.output_logprobs, tok.new_ids))
            if tok.output_top_logprobs is not None:
                self.output_top_logprobs.extend(self._top_entries(tok.output_top_logprobs))
            if tok.input_logprobs is not None:
                start = max(self.req.logprob_start_len, 0)
                ids = tok.input_ids if tok.input_ids is not None else self.req.input_ids[start:]
                self.input_logprobs = self._entries(tok.input_logprobs, ids)
                if self.input_logprobs:
                    self.input_logprobs[0][0] = None  # the window's first token is unscored
            if tok.input_top_logprobs is not None:
                self.input_top_logprobs = self._top_entries(tok.input_top_logprobs)
        if tok.finish is not None:
            self.finish_reason = tok.finish.to_json()
            self.closed_early = tok.finish.closed_early

    def _meta(self, output_logprobs: list[list], output_top: list[list | None]) -> dict:
        meta: dict[str, Any] = {
            "id": self.req.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }
        if self.closed_early:
            meta["closed_early"] = True
        if self.req.return_logprob:
            meta["input_token_logprobs"] = self.input_logprobs
            meta["output_token_logprobs"] = output_logprobs
            meta["output_token_logprobs_length"] = len(self.output_logprobs)
            if self.req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = self.input_top_logprobs
                meta["output_top_logprobs"] = output_top
        meta["e2e_latency"] = round(time.monotonic() - self.start_time, 6)
        return meta

    def _body(self, meta: dict) -> dict:
        text = self.text
        if self.reasoning is not None:
            meta["reasoning_text"], text = self.reasoning.split(
                text, self.reasoning_mode, final=self.finished)
            meta["reasoning_tokens"] = self.reasoning.reasoning_tokens(self.reasoning_mode,
                                                                       self.output_ids)
        body: dict[str, Any] = {"text": text, "output_ids": list(self.output_ids),
                                "meta_info": meta}
        if self.index is not None:
            body["index"] = self.index
        return body

    def result(self) -> dict:
        return self._body(self._meta(self.output_logprobs, self.output_top_logprobs))

    def event(self) -> dict:
        """A stream event: cumulative text, ids and counts; logprob lists as deltas."""
        delta = self.output_logprobs[self._streamed_logprobs:]
        delta_top = self.output_top_logprobs[self._streamed_top:]
        self._streamed_logprobs = len(self.output_logprobs)
        self._streamed_top = len(self.output_top_logprobs)
        return self._body(self._meta(delta, delta_top))


def raise_if_rejected(builders: list[ResponseBuilder]) -> None:
    """Raise the error of the first request the scheduler refused (see errors.rejection)."""
    for builder in builders:
        error = rejection(builder.finish_reason)
        if error is not None:
            raise error


def describe_model(model_info: dict, tokenizer: Any, **extra: Any) -> dict:
    """The /get_model_info body: the scheduler's model_info, the tokenizer's chat template and
    special tokens (what a client needs to render chat turns itself), and `extra` fields."""
    info = {**model_info, "is_generation": True,
            "chat_template": getattr(tokenizer, "chat_template", None),
            "bos_token": getattr(tokenizer, "bos_token", None),
            "eos_token": getattr(tokenizer, "eos_token", None)}
    info.update({k: v for k, v in extra.items() if v is not None})
    info.setdefault("tokenizer_path", info.get("model_path"))
    return info
