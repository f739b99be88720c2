"""A request's speculation fields, checked: `speculative` (on or off for this request; unset:
the server's --speculative-algorithm decides) and `prediction` (the text the client expects the
output to be, drafted first: OpenAI's Predicted Outputs). Native /generate bodies and OpenAI
requests share them."""

from __future__ import annotations

from typing import Any

from .errors import InvalidRequest

MAX_PREDICTION_TOKENS = 32768


def speculation_fields(fields: Any, tokenizer: Any) -> dict[str, Any]:
    """GenerateReq's `speculative` and `prediction_ids` from a body (a dict) or an OpenAI
    request model (its `prediction` is {type: content, content: text or text parts})."""
    get = fields.get if isinstance(fields, dict) else (lambda k: getattr(fields, k, None))
    speculative = get("speculative")
    if speculative is not None and not isinstance(speculative, bool):
        raise InvalidRequest(f"speculative must be true or false (got {speculative!r})",
                             param="speculative")
    text = prediction_text(get("prediction"))
    if not text:
        return {"speculative": speculative, "prediction_ids": None}
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > MAX_PREDICTION_TOKENS:
        raise InvalidRequest(f"prediction has {len(ids)} tokens; the limit is "
                             f"{MAX_PREDICTION_TOKENS}", param="prediction")
    return {"speculative": speculative, "prediction_ids": list(ids)}


def prediction_text(prediction: Any) -> str | None:
    """The text of a prediction: a string (native), or OpenAI's {type: "content", content}
    whose content is a string or a list of text parts."""
    if prediction is None:
        return None
    if isinstance(prediction, str):
        return prediction
    if isinstance(prediction, dict):
        if prediction.get("type") != "content":
            raise InvalidRequest('prediction must be {"type": "content", "content": ...}',
                                 param="prediction")
        content = prediction.get("content")
    else:  # the OpenAI request model's Prediction
        content = prediction.content
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None)
                 for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise InvalidRequest("prediction's content must be a string or a list of text parts",
                         param="prediction")
