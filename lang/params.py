"""Sampling options: `GenParams`, the one definition `gen`, `run` and `run_batch` share.

A GenParams field is a sampling option the DSL exposes: its name is `gen`'s keyword (and a
`run` default), `SAMPLING_NAMES` maps the names that differ from SamplingParams' (the wire's),
and its default is SamplingParams' (radixflow.runtime.sampling_params, where options are
defined and checked).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from radixflow.runtime.sampling_params import OPTIONS, SamplingParams

from .errors import InvalidRequest

# The DSL's names (SGLang's frontend's) that are not SamplingParams' -> SamplingParams'.
SAMPLING_NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}


@dataclass(frozen=True)
class GenParams:
    """Sampling options, defined once: used by `gen`, and as defaults by `run` / `run_batch`.

    A field left None falls back to the run's defaults, then to DEFAULT_PARAMS. Lists are
    held as tuples (the IR is frozen).
    """

    max_tokens: int | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] | None = None
    stop_regex: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    seed: int | None = None

    @classmethod
    def make(cls, **kwargs: Any) -> GenParams:
        """Build from user keywords; `stop` and `stop_regex` may be a string or a list;
        SamplingParams' names (`max_new_tokens`, ...) alias the DSL's."""
        options = {_DSL_NAMES.get(key, key): value for key, value in kwargs.items()}
        unknown = set(options) - set(FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown sampling option(s) {sorted(unknown)}; "
                                 f"known: {', '.join(FIELDS)}")
        return cls(**{key: _frozen(OPTIONS[sampling_name(key)].read(value))
                      for key, value in options.items()})

    def merged(self, defaults: GenParams) -> GenParams:
        """Self's set fields over `defaults`."""
        changes = {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}
        return dataclasses.replace(defaults, **changes)

    def to_sampling_params(self) -> dict[str, Any]:
        """The native `sampling_params` dict: every option, unset ones at their defaults."""
        p = self.merged(DEFAULT_PARAMS)
        out: dict[str, Any] = {}
        for name in FIELDS:
            value = getattr(p, name)
            if value is not None:
                out[sampling_name(name)] = list(value) if isinstance(value, tuple) else value
        return out


def sampling_name(name: str) -> str:
    """The SamplingParams name (the wire's) of GenParams field `name`."""
    return SAMPLING_NAMES.get(name, name)


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


FIELDS = tuple(f.name for f in dataclasses.fields(GenParams))
_DSL_NAMES = {native: name for name, native in SAMPLING_NAMES.items()}
_SAMPLING_DEFAULTS = SamplingParams()
DEFAULT_PARAMS = GenParams(**{
    name: _frozen(getattr(_SAMPLING_DEFAULTS, sampling_name(name))) for name in FIELDS})


@dataclass(frozen=True)
class LogprobDefaults:
    """SGLang's run() logprob keywords: what every gen that asks for no logprobs itself gets
    (a gen's own return_logprob / logprob_start_len / top_logprobs_num win)."""

    return_logprob: bool = False
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None

    @classmethod
    def take(cls, kwargs: dict[str, Any], keep: Container[str] = ()) -> LogprobDefaults:
        """Pop run()'s logprob keywords out of `kwargs` (not the program's own arguments,
        `keep`)."""
        found = {k: kwargs.pop(k) for k in (*LOGPROB_OPTIONS, "return_text_in_logprobs")
                 if k in kwargs and k not in keep}
        if found.pop("return_text_in_logprobs", None) is False:
            raise InvalidRequest("return_text_in_logprobs=False: radixflow always gives each "
                                 "logprob's token text")
        return cls(**{k: v for k, v in found.items() if v is not None})


LOGPROB_OPTIONS = ("return_logprob", "logprob_start_len", "top_logprobs_num")
NO_LOGPROBS = LogprobDefaults()
