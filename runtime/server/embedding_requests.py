"""An embedding body's inputs into GenerateReqs (one per input, no output tokens, an EmbedSpec
with the pooling the scheduler resolved at start-up), refusing with a 400 that names the field
and the limit: a generation server, too many inputs, an empty input, a token id outside the
vocabulary, an input as long as the context, `dimensions` above the hidden size. Tokenizes, so
routes call it off the event loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ContextTooLong, InvalidRequest, RadixflowError
from ..messages import EmbedSpec, GenerateReq, ReqTextOut
from ..model_loader.pooling import EMBEDDING_ON_GENERATION_SERVER
from ..request_building import new_rid, tokenize_prompt
from ..response_builder import ResponseBuilder
from ..sampling_params import SamplingParams
from .embedding_protocol import MAX_INPUTS

if TYPE_CHECKING:
    from .scheduler_client import SchedulerClient

EMBED_SAMPLING = SamplingParams(max_new_tokens=0)  # the prompt only: nothing is sampled


@dataclass
class EmbeddingJob:
    reqs: list[GenerateReq]  # input i is reqs[i]
    batch: bool  # the inputs came as a list (/encode then answers a list)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.input_ids) for r in self.reqs)


class EmbeddingBuilder(ResponseBuilder):
    """A ResponseBuilder that keeps the request's vector (its only output, at the finish)."""

    embedding: list[float] | None = None

    def add(self, out: ReqTextOut) -> None:
        super().add(out)
        if out.token.embedding is not None:
            self.embedding = out.token.embedding

    def vector(self) -> list[float]:
        if self.embedding is None:  # aborted (/abort_request) before it was computed
            reason = (self.finish_reason or {}).get("message") or "no embedding came back"
            raise RadixflowError(f"the request was aborted: {reason}")
        return self.embedding


def encode_result(builders: list[EmbeddingBuilder], job: EmbeddingJob) -> Any:
    """/encode's answer (and Engine.encode's): one object per input, a list for a batch."""
    outs = [{"embedding": b.vector(), "meta_info": {
        "id": b.req.rid, "finish_reason": b.finish_reason, "prompt_tokens": b.prompt_tokens,
        "cached_tokens": b.cached_tokens}} for b in builders]
    return outs if job.batch else outs[0]


def embedding_info(client: SchedulerClient) -> dict:
    """The scheduler's pooling (model_info["embedding"]); a 400 on a generation server."""
    info = client.model_info.get("embedding")
    if info is None:
        raise InvalidRequest(EMBEDDING_ON_GENERATION_SERVER)
    return info


def embedding_job(client: SchedulerClient, items: list[str | list[int]], *, batch: bool,
                  dimensions: int | None, param: str) -> EmbeddingJob:
    """`items`: the inputs, each a text or token ids; `param`: the field they came in."""
    info = embedding_info(client)
    if dimensions is not None and dimensions > info["hidden_size"]:
        raise InvalidRequest(f"dimensions is {dimensions}; this model's embeddings have "
                             f"{info['hidden_size']} (its hidden size) at most",
                             param="dimensions")
    if not items:
        raise InvalidRequest(f"{param} must not be empty", param=param)
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"{param} holds {len(items)} inputs; the limit is {MAX_INPUTS}",
                             param=param)
    spec = EmbedSpec(pooling=info["pooling"], normalize=info["normalize"],
                     dimensions=dimensions)
    reqs = []
    for k, item in enumerate(items):
        where = f"{param}[{k}]" if batch else param
        reqs.append(GenerateReq(rid=new_rid(), input_ids=_input_ids(client, item, where),
                                sampling=EMBED_SAMPLING, embed=spec))
    return EmbeddingJob(reqs, batch)


def openai_inputs(value: Any) -> tuple[list[str | list[int]], bool]:
    """/v1/embeddings' `input` (a string, strings, token ids, lists of token ids) as inputs."""
    if isinstance(value, str) or (value and isinstance(value[0], int)):
        return [value], False
    return list(value), True


def encode_inputs(text: Any, input_ids: Any) -> tuple[list[str | list[int]], bool, str]:
    """/encode's `text` or `input_ids` as inputs, whether they are a batch, and the field."""
    if (text is None) == (input_ids is None):
        raise InvalidRequest("give exactly one of text and input_ids", param="text")
    if text is not None:
        return ([text], False, "text") if isinstance(text, str) else (list(text), True, "text")
    if input_ids and isinstance(input_ids[0], int):
        return [input_ids], False, "input_ids"
    return list(input_ids), True, "input_ids"


def _input_ids(client: SchedulerClient, item: str | list[int], where: str) -> list[int]:
    if isinstance(item, str):
        if not item:
            raise InvalidRequest(f"{where} is an empty string", param=where)
        ids = tokenize_prompt(client.tokenizer, item)
    else:
        ids = list(item)
        if not ids:
            raise InvalidRequest(f"{where} is an empty list of token ids", param=where)
        if any(not 0 <= t < client.vocab_size for t in ids):
            raise InvalidRequest(f"{where} holds a token id outside [0, {client.vocab_size})",
                                 param=where)
    if len(ids) >= client.context_length:
        raise ContextTooLong(f"{where} has {len(ids)} tokens; an input must be shorter than "
                             f"the model's context length of {client.context_length} tokens",
                             param=where)
    return ids
