"""The part of a request that decides cache-aware routing: its prompt, as characters."""

from __future__ import annotations

from typing import Any

from ..balance.prefix_tree import token_key

# path -> the field that holds its prompt (a chat's messages for the chat APIs)
PROMPT_FIELDS = {"/v1/completions": "prompt", "/generate": "text", "/encode": "text",
                 "/v1/embeddings": "input"}


def routing_key(path: str, body: Any) -> str | None:
    """The prompt of a generation or embedding body (a chat's messages as text, with
    Anthropic's system and the Responses API's instructions first; token ids as characters);
    None when it has none. A batch goes where its first prompt goes."""
    if not isinstance(body, dict):
        return None
    if path == "/v1/chat/completions":
        return _chat_key(body.get("messages"))
    if path == "/v1/messages":
        return _chat_key([{"role": "system", "content": body.get("system")},
                          *_list(body.get("messages"))])
    if path == "/v1/responses":
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        return _chat_key([{"role": "system", "content": body.get("instructions")},
                          *_list(items)])
    prompt = _first(body.get(PROMPT_FIELDS.get(path, "text")))
    if path in ("/generate", "/encode") and prompt is None:
        prompt = _first(body.get("input_ids"))
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < 0x110000
                                        for t in prompt):
        return token_key(prompt)
    return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _first(value: Any) -> Any:
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return value[0]
    return value


def _chat_key(messages: Any) -> str | None:
    if not isinstance(messages, list):
        return None
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<{m.get('role')}>{content if isinstance(content, str) else ''}\n")
    return "".join(parts)
