"""Role rendering with the model's own Jinja chat template.

The template is rendered the way transformers' `apply_chat_template` renders it (sandboxed
Jinja, trim_blocks, lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`). A role's
opening and closing text are found by rendering the conversation with a sentinel content and
cutting around it, so they come out exactly as the model was trained to see them, including
things a template adds only at a given position (a default system turn before the first
message, a BOS at the start).
"""

from __future__ import annotations

import functools
import json
import re
import weakref
from datetime import datetime
from typing import Any

from .errors import InvalidRequest

_SENTINEL = "\x00radixflow-content\x00"
_FILLER = "x"

# SGLang's "default" template: used when the model ships none.
DEFAULT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)
# Fallbacks for servers that report a model path but no template.
CHATML_TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)


@functools.lru_cache(maxsize=32)
def _compile(source: str):
    from jinja2 import ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as exc:
        raise InvalidRequest(f"the model's chat template does not parse: {exc}") from None


class ChatTemplate:
    """Renders role turns of one model.

    `source` is the Jinja template (a string, or the list of named templates a tokenizer config
    may hold); None means SGLang's plain `ROLE: ...` template.
    """

    def __init__(self, source: str | list | None = None, *, bos_token: str | None = None,
                 eos_token: str | None = None, extra_context: dict[str, Any] | None = None):
        if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        self.source = source or DEFAULT_TEMPLATE
        self.is_default = not source
        self._context = {"bos_token": bos_token or "", "eos_token": eos_token or "",
                         **(extra_context or {})}
        self._template = _compile(self.source)
        self._cache: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """The template of a Hugging Face tokenizer (or the default one if it has none)."""
        return cls(getattr(tokenizer, "chat_template", None),
                   bos_token=getattr(tokenizer, "bos_token", None),
                   eos_token=getattr(tokenizer, "eos_token", None))

    @classmethod
    def from_model_info(cls, info: dict[str, Any]) -> ChatTemplate:
        """The template a server reports in /get_model_info (`chat_template`, `bos_token`...)."""
        return cls(info.get("chat_template"), bos_token=info.get("bos_token"),
                   eos_token=info.get("eos_token"))

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = False) -> str:
        """The template applied to `messages`, as `apply_chat_template(tokenize=False)`."""
        from jinja2.exceptions import TemplateError

        try:
            return self._template.render(messages=messages,
                                         add_generation_prompt=add_generation_prompt,
                                         **self._context)
        except TemplateError as exc:
            raise InvalidRequest(f"chat template failed for roles "
                                 f"{[m['role'] for m in messages]}: {exc}") from None

    def role_texts(self, role: str, history: list[str] | tuple[str, ...] = ()) -> tuple[str, str]:
        """(opening, closing) text of a `role` turn that follows turns with roles `history`."""
        key = (role, tuple(history))
        if key not in self._cache:
            self._cache[key] = self._split(role, list(history))
        return self._cache[key]

    def end_of_turn(self, role: str = "assistant",
                    history: list[str] | tuple[str, ...] = ()) -> str | None:
        """The stop string that ends a `role` turn (e.g. "<|im_end|>"); None if only whitespace."""
        closing = self.role_texts(role, history)[1].strip()
        return closing or None

    def _split(self, role: str, history: list[str]) -> tuple[str, str]:
        before = [{"role": r, "content": _FILLER} for r in history]
        try:
            full = self.render(before + [{"role": role, "content": _SENTINEL}])
            prev = self.render(before) if before else ""
        except InvalidRequest:
            # Some templates insist on an order (user/assistant alternation): render the turn alone.
            full, prev = self.render([{"role": role, "content": _SENTINEL}]), ""
        cut = full.find(_SENTINEL)
        if cut < 0:
            raise InvalidRequest(f"the chat template drops the content of {role!r} turns")
        head, tail = full[:cut], full[cut + len(_SENTINEL):]
        if prev:
            if not head.startswith(prev):  # the template rewrites earlier turns: no clean cut
                return self._split(role, [])
            head = head[len(prev):]
        return head, tail


# When a server does not report its chat template: SGLang's rules on model_path, abridged.
_TEMPLATE_BY_PATH = (
    (re.compile(r"llama-3.*instruct", re.IGNORECASE), LLAMA3_TEMPLATE),
    (re.compile(r"smollm.*instruct|qwen.*(chat|instruct)|tinyllama|chatml", re.IGNORECASE),
     CHATML_TEMPLATE),
)


def template_from_model_info(info: dict[str, Any]) -> ChatTemplate:
    """The template a /get_model_info body reports, else one guessed from its model_path."""
    if info.get("chat_template"):
        return ChatTemplate.from_model_info(info)
    path = str(info.get("model_path", ""))
    for pattern, source in _TEMPLATE_BY_PATH:
        if pattern.search(path):
            return ChatTemplate(source, bos_token=info.get("bos_token"),
                                eos_token=info.get("eos_token"))
    return ChatTemplate(None)


_templates: weakref.WeakKeyDictionary[Any, ChatTemplate] = weakref.WeakKeyDictionary()


def chat_template_of(backend: Any) -> ChatTemplate:
    """The template programs on `backend` render roles with: its own `chat_template` if it
    carries a ChatTemplate, else the one its `model_info` reports (built once per backend)."""
    own = getattr(backend, "chat_template", None)
    if isinstance(own, ChatTemplate):
        return own
    template = _templates.get(backend)
    if template is None:
        template = _templates[backend] = template_from_model_info(backend.model_info)
    return template
