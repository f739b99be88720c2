"""--chat-template: a Jinja file, or the template itself. A leaf (jinja2 only): ServerArgs
checks the flag with it, and the processes that render chats read the text with it."""

from __future__ import annotations

import os


def chat_template_text(spec: str) -> str:
    """The Jinja text of --chat-template: a file's contents, or the text itself. Raises
    ValueError when it is neither a readable file nor a template that parses."""
    text = spec
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            text = f.read()
    elif "{{" not in spec and "{%" not in spec:
        raise ValueError(f"--chat-template {spec!r}: no such file, and not a Jinja template")
    import jinja2

    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"--chat-template does not parse: {exc}") from None
    return text
