"""One request's response, assembled from the ReqTextOuts that come back for it.

A `ResponseBuilder` gives the native /generate object (non-stream) or its stream events
(shared/protocol/sglang-native-api.md); the OpenAI routes build their choices from its fields.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .detokenize import decode_token_texts
from .errors import rejection
from .messages import GenerateReq, ReqTextOut, SpecCounts
from .reasoning import ReasoningParser

# JSON has no -inf; a logprob of a token the sampler could never pick is reported as this.
LOGPROB_FLOOR = -9999.0


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
        self.spec: SpecCounts | None = None  # a request that speculated: its counts so far
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
        if tok.spec is not None:
            self.spec = tok.spec
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
        if self.spec is not None:
            meta.update(spec_meta(self.spec))
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


def spec_meta(spec: SpecCounts) -> dict[str, Any]:
    """A speculating request's meta_info fields, as SGLang names them: verify passes, tokens
    drafted and accepted, the acceptance rate and the tokens a verify pass made on average."""
    passes, drafted, accepted = spec.verify_passes, spec.draft_tokens, spec.accepted_tokens
    return {"spec_verify_ct": passes, "spec_draft_token_num": drafted,
            "spec_accept_token_num": accepted,
            "spec_accept_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "spec_accept_length": round(1 + accepted / passes, 4) if passes else 1.0}
