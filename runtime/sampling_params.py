"""Sampling parameters: each option defined once, with its range and check, validated once.

`SamplingParams` is the one definition of a sampling option: a field made by `option(...)`
(sampling_options.py) gives its type, default and allowed values, and `validate()` and
`from_dict()` read only those. Every surface derives its names from it:

- `/generate`, the Engine and `/program` use the field names themselves, plus
  `GENERATE_ALIASES` (SGLang's other spellings): nothing to add per option;
- the OpenAI routes: a request-model field `sampling_field("<option>")` in
  server/openai_protocol.py is the option's OpenAI name and takes its bounds from here; the
  request mapping (server/openai_requests.py) and the DSL's OpenAI backend read those names;
- the DSL: a `GenParams` field (lang/params.py) is `gen`'s keyword, a `run` default and its
  wire key; its default comes from here.

So a new option is: (1) one field here, with its range or check; (2) one `sampling_field`
line in server/openai_protocol.py if OpenAI requests expose it; (3) one `GenParams` field in
lang/params.py if the DSL does. Three places in three files, plus the code that acts on the
option (runtime/sampling/, the scheduler).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest
from .sampling_options import (
    Option,
    Range,
    at_least,
    between,
    choice_list,
    interval,
    json_text,
    one_or_list,
    option,
    stop_patterns,
    strings,
    token_biases,
    token_id_keys,
    token_ids,
)

# Keys SGLang accepts that radixflow does not implement: a request that sets one is refused
# (400 naming it) rather than served as if it had not been asked.
_UNSUPPORTED_KEYS = frozenset({"custom_params", "lora_path"})
# SGLang's names for our options, in /generate's sampling_params.
GENERATE_ALIASES = {"sampling_seed": "seed"}
MAX_NEW_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 64
MAX_STOP_REGEXES = 16
MAX_STOP_REGEX_LEN = 1024
MAX_LOGIT_BIAS = 4096  # entries per request
LOGIT_BIAS_LIMIT = 100.0  # |bias| <= 100; -100 bans the token (-inf), as OpenAI documents
CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")


@dataclass
class SamplingParams:
    max_new_tokens: int = option(128, int, between(0, MAX_NEW_TOKENS_LIMIT))
    min_new_tokens: int = option(0, int, at_least(0))
    temperature: float = option(1.0, float, interval("[0, 100]"))
    top_p: float = option(1.0, float, interval("(0, 1]"))
    top_k: int = option(-1, int, Range(1, None, "must be -1 (disabled) or >= 1", also=(-1,)))
    min_p: float = option(0.0, float, interval("[0, 1]"))
    repetition_penalty: float = option(1.0, float, interval("(0, 10]"))
    frequency_penalty: float = option(0.0, float, interval("[-2, 2]"))
    presence_penalty: float = option(0.0, float, interval("[-2, 2]"))
    stop: list[str] = option([], check=strings(at_most=MAX_STOP_STRINGS), wire=one_or_list)
    stop_regex: list[str] = option(  # end at the first match
        [], check=stop_patterns(at_most=MAX_STOP_REGEXES, max_len=MAX_STOP_REGEX_LEN),
        wire=one_or_list)
    stop_token_ids: list[int] = option([], check=token_ids)
    ignore_eos: bool = option(False, bool)
    skip_special_tokens: bool = option(True, bool)
    spaces_between_special_tokens: bool = option(True, bool)  # the tokenizer's decode option
    no_stop_trim: bool = option(False, bool)
    # stream every this many tokens (None: every step)
    stream_interval: int | None = option(None, int, at_least(1))
    logit_bias: dict[int, float] | None = option(  # token id -> added to its logit
        None, check=token_biases(at_most=MAX_LOGIT_BIAS, limit=LOGIT_BIAS_LIMIT),
        wire=token_id_keys)
    n: int = option(1, int, interval("[1, 128]"))
    seed: int | None = option(None, int)
    # Reasoning models (--reasoning-parser): the end-of-thinking marker is forced once the
    # thinking has this many tokens (runtime/scheduler/reasoning.py).
    thinking_budget: int | None = option(None, int, between(0, MAX_NEW_TOKENS_LIMIT))
    # Constraints (at most one). Handled by runtime/constrained.
    regex: str | None = option(None, str)
    # a JSON document (a dict is serialised on the way in)
    json_schema: str | None = option(None, str, wire=json_text)
    ebnf: str | None = option(None, str)
    choices: list[str] | None = option(None, check=choice_list)
    # JSON: xgrammar's or SGLang's structural tag
    structural_tag: str | None = option(None, str, wire=json_text)
    # Budget-safe structured output (constrained/closing.py): a constrained output that would
    # run out of max_new_tokens ends with a completion of its grammar instead.
    budget_safe: bool = option(True, bool)
    # Constrained only: the longest run of one character (or one token) the mask lets the
    # model write; None: no limit (constrained/repeat_guard.py).
    max_repeat_run: int | None = option(None, int, between(2, 64))

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, str] | None:
        """(kind, spec) of the output constraint, or None."""
        import json

        if self.regex is not None:
            return ("regex", self.regex)
        if self.json_schema is not None:
            return ("json_schema", self.json_schema)
        if self.ebnf is not None:
            return ("ebnf", self.ebnf)
        if self.choices is not None:
            return ("choices", json.dumps(self.choices))
        if self.structural_tag is not None:
            return ("structural_tag", self.structural_tag)
        return None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None,
                  defaults: Mapping[str, Any] | None = None) -> SamplingParams:
        """Build from a wire dict (SGLang native shape). Nulls mean defaults; unknown keys fail.

        `defaults`: option -> the value an option the dict leaves unset (or null) takes instead
        of the field's default: the model's sampling defaults (model_loader/
        generation_defaults.py), which every route passes here. A value the dict gives wins."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise InvalidRequest("sampling_params must be an object", param="sampling_params")
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key in _UNSUPPORTED_KEYS:
                if value is None:
                    continue
                raise InvalidRequest(f"{key} is not supported", param=key)
            key = GENERATE_ALIASES.get(key, key)
            if key not in OPTIONS:
                raise InvalidRequest(f"unknown sampling parameter {key!r}", param=key)
            if value is not None:
                kwargs[key] = value
        for key, value in (defaults or {}).items():
            kwargs.setdefault(key, value)
        params = cls(**{key: OPTIONS[key].read(value) for key, value in kwargs.items()})
        params.validate()
        return params

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad field (every field's type first, then
        every value, in field order); normalise what passes (ints given for floats)."""
        for name, described in OPTIONS.items():
            described.check_type(name, getattr(self, name))
        for name, described in OPTIONS.items():
            value = getattr(self, name)
            checked = described.check_value(name, value)
            if checked is not value:
                setattr(self, name, checked)
        constraints = [k for k in CONSTRAINT_FIELDS if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise InvalidRequest(f"at most one constraint may be given, got {constraints}",
                                 param=constraints[1])

    def check_vocab(self, vocab_size: int) -> None:
        """Raise InvalidRequest if logit_bias names a token id outside [0, vocab_size)."""
        if self.logit_bias:
            bad = next((t for t in self.logit_bias if t >= vocab_size), None)
            if bad is not None:
                raise InvalidRequest(f"logit_bias names token id {bad}, outside the vocabulary "
                                     f"[0, {vocab_size})", param="logit_bias")


# Field name -> how it is checked and read; the order is the fields' (validate's order).
OPTIONS: dict[str, Option] = {f.name: f.metadata["option"]
                              for f in dataclasses.fields(SamplingParams)}


def check_option(name: str, value: Any) -> Any:
    """`value` checked as option `name` would be in a request (InvalidRequest naming it)."""
    return OPTIONS[name].checked(name, value)
