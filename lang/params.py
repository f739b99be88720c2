"""Sampling options: `GenParams`, the one definition `gen`, `run` and `run_batch` share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .errors import InvalidRequest


@dataclass(frozen=True)
class GenParams:
    """Sampling options, defined once: used by `gen`, and as defaults by `run` / `run_batch`.

    A field left None falls back to the run's defaults, then to DEFAULT_PARAMS.
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
        `max_new_tokens` aliases `max_tokens`."""
        if "max_new_tokens" in kwargs:
            kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
        if "min_new_tokens" in kwargs:
            kwargs["min_tokens"] = kwargs.pop("min_new_tokens")
        unknown = set(kwargs) - set(FIELDS)
        if unknown:
            raise InvalidRequest(f"unknown sampling option(s) {sorted(unknown)}; "
                                 f"known: {', '.join(FIELDS)}")
        for key in ("stop", "stop_regex"):
            value = kwargs.get(key)
            if isinstance(value, str):
                kwargs[key] = (value,)
            elif value is not None:
                kwargs[key] = tuple(value)
        if kwargs.get("stop_token_ids") is not None:
            kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
        return cls(**kwargs)

    def merged(self, defaults: GenParams) -> GenParams:
        """Self's set fields over `defaults`."""
        changes = {f: getattr(self, f) for f in FIELDS if getattr(self, f) is not None}
        return dataclasses.replace(defaults, **changes)

    def to_sampling_params(self) -> dict[str, Any]:
        """The native `sampling_params` dict (unset fields take SGLang's defaults)."""
        p = self.merged(DEFAULT_PARAMS)
        out: dict[str, Any] = {
            "max_new_tokens": p.max_tokens, "min_new_tokens": p.min_tokens,
            "stop": list(p.stop or ()), "stop_token_ids": list(p.stop_token_ids or ()),
            "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k, "min_p": p.min_p,
            "frequency_penalty": p.frequency_penalty, "presence_penalty": p.presence_penalty,
            "ignore_eos": p.ignore_eos,
        }
        if p.repetition_penalty is not None:
            out["repetition_penalty"] = p.repetition_penalty
        if p.stop_regex:
            out["stop_regex"] = list(p.stop_regex)
        if p.seed is not None:
            out["seed"] = p.seed  # radixflow's name; SGLang calls it sampling_seed
        return out


FIELDS = tuple(f.name for f in dataclasses.fields(GenParams))
DEFAULT_PARAMS = GenParams(max_tokens=128, min_tokens=0, stop=(), stop_token_ids=(),
                           temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0, frequency_penalty=0.0,
                           presence_penalty=0.0, ignore_eos=False)
