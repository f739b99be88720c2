"""The chat turns a program's nodes make, for backends that take messages rather than text.

A message is {"role", "content"} plus "open": True while its turn is open: role_begin opens a
turn, every piece of text a node appends inside it goes into its content, role_end closes it.
"""

from __future__ import annotations


def add_piece(messages: list[dict], node: dict, piece: str) -> None:
    """Fold node `node`, which appended `piece` to the text, into `messages` (in place)."""
    is_open = bool(messages) and messages[-1].get("open", False)
    match node["type"]:
        case "role_begin":
            messages.append({"role": node["role"], "content": "", "open": True})
        case "role_end":
            if is_open:
                messages[-1].pop("open")
        case _:
            if is_open:
                messages[-1]["content"] += piece


def closed_messages(messages: list[dict]) -> list[dict[str, str]]:
    """The finished turns, as {"role", "content"} dicts."""
    return [{"role": m["role"], "content": m["content"]} for m in messages if not m.get("open")]


def message_kwargs(messages: list[dict]) -> dict:
    """The chat so far, as the `messages` and `in_open_role` of a /generate body."""
    return {"messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "in_open_role": messages[-1]["role"] if messages and messages[-1].get("open") else None}
