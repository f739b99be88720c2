"""Sampling parameters: one definition, validated once, used everywhere."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidRequest

# Keys SGLang accepts that radixflow does not implement: a request that sets one is refused
# (400 naming it) rather than served as if it had not been asked.
_UNSUPPORTED_KEYS = frozenset({"custom_params", "lora_path"})
MAX_NEW_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 64
MAX_STOP_REGEXES = 16
MAX_STOP_REGEX_LEN = 1024
MAX_LOGIT_BIAS = 4096  # entries per request
LOGIT_BIAS_LIMIT = 100.0  # |bias| <= 100; -100 bans the token (-inf), as OpenAI documents


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)  # end at the first match
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # passed to the tokenizer's decode
    no_stop_trim: bool = False
    stream_interval: int | None = None  # stream every this many tokens (None: every step)
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    n: int = 1
    seed: int | None = None
    # Reasoning models (--reasoning-parser): the end-of-thinking marker is forced once the
    # thinking has this many tokens (runtime/scheduler/reasoning.py).
    thinking_budget: int | None = None
    # Constraints (at most one). Handled by runtime/constrained.
    regex: str | None = None
    json_schema: str | None = None  # a JSON document (a dict is serialised on the way in)
    ebnf: str | None = None
    choices: list[str] | None = None
    structural_tag: str | None = None  # JSON: xgrammar's or SGLang's structural tag
    # Budget-safe structured output (constrained/closing.py): a constrained output that would
    # run out of max_new_tokens ends with a completion of its grammar instead.
    budget_safe: bool = True
    # Constrained only: the longest run of one character (or one token) the mask lets the
    # model write; None: no limit (constrained/repeat_guard.py).
    max_repeat_run: int | None = None

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
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a wire dict (SGLang native shape). Nulls mean defaults; unknown keys fail."""
        import json

        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise InvalidRequest("sampling_params must be an object", param="sampling_params")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key in _UNSUPPORTED_KEYS:
                if value is None:
                    continue
                raise InvalidRequest(f"{key} is not supported", param=key)
            if key == "sampling_seed":  # SGLang's name for `seed`
                key = "seed"
            if key not in known:
                raise InvalidRequest(f"unknown sampling parameter {key!r}", param=key)
            if value is None:
                continue
            kwargs[key] = value
        for key in ("stop", "stop_regex"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = [kwargs[key]]
        if isinstance(kwargs.get("logit_bias"), dict):
            kwargs["logit_bias"] = _token_id_keys(kwargs["logit_bias"])
        for key in ("json_schema", "structural_tag"):
            if isinstance(kwargs.get(key), dict):
                kwargs[key] = json.dumps(kwargs[key])
        params = cls(**kwargs)
        params.validate()
        return params

    def validate(self) -> None:
        """Raise InvalidRequest naming the first bad field."""

        def bad(name: str, why: str) -> InvalidRequest:
            return InvalidRequest(f"{name} {why} (got {getattr(self, name)!r})", param=name)

        def check_type(name: str, types: tuple[type, ...]) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) and bool not in types:
                raise bad(name, f"must be {'/'.join(t.__name__ for t in types)}")
            if not isinstance(value, types):
                raise bad(name, f"must be {'/'.join(t.__name__ for t in types)}")

        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            check_type(name, (int,))
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "frequency_penalty", "presence_penalty"):
            check_type(name, (int, float))
            setattr(self, name, float(getattr(self, name)))
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            check_type(name, (bool,))
        if self.seed is not None:
            check_type("seed", (int,))
        if self.thinking_budget is not None:
            check_type("thinking_budget", (int,))
            if not 0 <= self.thinking_budget <= MAX_NEW_TOKENS_LIMIT:
                raise bad("thinking_budget", f"must be between 0 and {MAX_NEW_TOKENS_LIMIT}")
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise bad("max_new_tokens", f"must be between 0 and {MAX_NEW_TOKENS_LIMIT}")
        if self.min_new_tokens < 0:
            raise bad("min_new_tokens", "must be >= 0")
        if not 0.0 <= self.temperature <= 100.0:
            raise bad("temperature", "must be in [0, 100]")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k == 0 or self.top_k < -1:
            raise bad("top_k", "must be -1 (disabled) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise bad("repetition_penalty", "must be in (0, 10]")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        if not 1 <= self.n <= 128:
            raise bad("n", "must be in [1, 128]")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise bad("stop", "must be a string or a list of strings")
        if any(s == "" for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise bad("stop", f"may hold at most {MAX_STOP_STRINGS} strings")
        self._validate_stop_regex()
        if self.stream_interval is not None:
            check_type("stream_interval", (int,))
            if self.stream_interval < 1:
                raise bad("stream_interval", "must be >= 1")
        self._validate_logit_bias()
        if not isinstance(self.stop_token_ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.stop_token_ids
        ):
            raise bad("stop_token_ids", "must be a list of non-negative ints")
        constraints = [k for k in ("regex", "json_schema", "ebnf", "choices", "structural_tag")
                       if getattr(self, k) is not None]
        if len(constraints) > 1:
            raise InvalidRequest(f"at most one constraint may be given, got {constraints}",
                                 param=constraints[1])
        for name in ("regex", "json_schema", "ebnf", "structural_tag"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise bad(name, "must be a string")
        if self.choices is not None and (
                not isinstance(self.choices, list) or not self.choices
                or not all(isinstance(c, str) and c for c in self.choices)):
            raise bad("choices", "must be a non-empty list of non-empty strings")
        check_type("budget_safe", (bool,))
        if self.max_repeat_run is not None:
            check_type("max_repeat_run", (int,))
            if not 2 <= self.max_repeat_run <= 64:
                raise bad("max_repeat_run", "must be between 2 and 64")

    def _validate_stop_regex(self) -> None:
        import regex

        patterns = self.stop_regex
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise InvalidRequest(f"stop_regex must be a string or a list of strings "
                                 f"(got {patterns!r})", param="stop_regex")
        if len(patterns) > MAX_STOP_REGEXES:
            raise InvalidRequest(f"stop_regex may hold at most {MAX_STOP_REGEXES} patterns",
                                 param="stop_regex")
        for pattern in patterns:
            if len(pattern) > MAX_STOP_REGEX_LEN:
                raise InvalidRequest(f"a stop_regex pattern may be at most {MAX_STOP_REGEX_LEN} "
                                     f"characters (got {len(pattern)})", param="stop_regex")
            try:
                compiled = regex.compile(pattern)
            except (regex.error, ValueError, OverflowError) as exc:
                raise InvalidRequest(f"stop_regex {pattern!r} is not a valid regex: {exc}",
                                     param="stop_regex") from None
            if compiled.fullmatch("") is not None:
                raise InvalidRequest(f"stop_regex {pattern!r} matches the empty string",
                                     param="stop_regex")

    def _validate_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict):
            raise InvalidRequest(f"logit_bias must be an object mapping token ids to numbers "
                                 f"(got {bias!r})", param="logit_bias")
        if len(bias) > MAX_LOGIT_BIAS:
            raise InvalidRequest(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens "
                                 f"(got {len(bias)})", param="logit_bias")
        for token, value in bias.items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise InvalidRequest(f"logit_bias keys must be token ids (non-negative ints), "
                                     f"got {token!r}", param="logit_bias")
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT):
                raise InvalidRequest(f"logit_bias of token {token} must be a number in "
                                     f"[-100, 100] (got {value!r})", param="logit_bias")
        self.logit_bias = {token: float(value) for token, value in bias.items()}

    def check_vocab(self, vocab_size: int) -> None:
        """Raise InvalidRequest if logit_bias names a token id outside [0, vocab_size)."""
        if self.logit_bias:
            bad = next((t for t in self.logit_bias if t >= vocab_size), None)
            if bad is not None:
                raise InvalidRequest(f"logit_bias names token id {bad}, outside the vocabulary "
                                     f"[0, {vocab_size})", param="logit_bias")


def _token_id_keys(bias: dict) -> dict:
    """logit_bias with its keys as ints: JSON (and OpenAI) sends them as strings ("50256")."""
    out: dict = {}
    for key, value in bias.items():
        token = key
        if isinstance(key, str):
            digits = key.strip()
            if not digits.isascii() or not digits.isdigit():
                raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}",
                                     param="logit_bias")
            token = int(digits)
        if token in out:
            raise InvalidRequest(f"logit_bias gives token {token} more than once",
                                 param="logit_bias")
        out[token] = value
    return out
