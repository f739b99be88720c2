"""Pydantic models of the embedding request bodies: OpenAI's /v1/embeddings and SGLang's
/encode. Strict as openai_protocol.py is: wrong JSON types and unknown fields are 400s naming
the field; the limits (inputs per call, empty inputs, the context) are checked while the
inputs are tokenized (embedding_requests.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_INPUTS = 2048  # inputs of one call (OpenAI's limit)

# One input or several, as text or token ids (OpenAI's four forms).
Inputs = str | list[str] | list[int] | list[list[int]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbeddingRequest(_Strict):
    model: str = Field(min_length=1)
    input: Inputs
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None  # accepted, unused


class EncodeRequest(_Strict):
    """SGLang's EmbeddingReqInput, its text-only part: `text` or `input_ids`, one or a batch."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    dimensions: int | None = Field(None, ge=1)
