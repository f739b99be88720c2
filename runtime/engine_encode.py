"""Engine.encode: SGLang's offline `Engine.encode(prompt)` on an `is_embedding=True` engine,
through the same request building and answer shape as the server's /encode."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .response_builder import raise_if_rejected

if TYPE_CHECKING:
    from .engine import Engine
    from .server.embedding_requests import EmbeddingJob


class _EmbedRequests:
    """What Engine._submit takes of a ParsedGenerate: the requests and their builders."""

    stream = False

    def __init__(self, job: EmbeddingJob):
        self.reqs = job.reqs

    def builders(self, tokenizer: Any) -> list:
        from .server.embedding_requests import EmbeddingBuilder

        return [EmbeddingBuilder(r, tokenizer) for r in self.reqs]


def run_encode(engine: Engine, prompt: Any, dimensions: int | None) -> dict | list[dict]:
    """`prompt`: a text, texts, token ids or lists of token ids; /encode's answer for it."""
    from .server.embedding_requests import embedding_job, encode_inputs, encode_result

    ids = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)
    items, batch, param = encode_inputs(None if ids else prompt, prompt if ids else None)
    scheduler = engine.scheduler
    view = SimpleNamespace(model_info=scheduler.model_info(), tokenizer=engine.tokenizer,
                           vocab_size=scheduler.runner.vocab_size,
                           context_length=scheduler.context_len)
    job = embedding_job(view, items, batch=batch, dimensions=dimensions,
                        param="prompt" if param == "text" else "prompt (token ids)")
    builders = engine.run_to_end(_EmbedRequests(job))
    raise_if_rejected(builders)
    return encode_result(builders, job)
