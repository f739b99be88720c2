"""`radixflow serve`'s flags, generated from ServerArgs' fields, and back."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from typing import Any, Literal

# vLLM's --generation-config -> --sampling-defaults (vLLM's third form, a folder, is not taken)
_GENERATION_CONFIG = {"auto": "model", "vllm": "openai"}
MODELS_EPILOG = ("Model families: docs/models.md lists the architectures radixflow loads and "
                 "what each supports (tensor parallelism, the C decode step, GGUF, quantized "
                 "formats, GPU); any other architecture is a start-up error naming it.")


class _DeprecatedFlag(argparse.Action):
    """A boolean flag's old name: sets it, and says which name to use instead."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(f"radixflow: {option_string} is deprecated, use {new}", file=sys.stderr)
        setattr(namespace, self.dest, True)


def add_flags(cls: type, parser: argparse.ArgumentParser) -> None:
    """One flag per ServerArgs field (its help, aliases, choices), plus vLLM's spellings."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        help_text = f.metadata.get("help", "")
        names = (flag, *f.metadata.get("aliases", ()))
        if hint is bool:
            parser.add_argument(*names, action="store_true", default=f.default,
                                help=help_text)
            for alias in f.metadata.get("deprecated_aliases", ()):
                parser.add_argument(alias, action=_DeprecatedFlag, dest=f.name, nargs=0,
                                    help=f"deprecated: use {flag}")
            continue
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is Literal:
            parser.add_argument(*names, choices=args, default=f.default, help=help_text)
            continue
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        if typing.get_origin(base) is list:
            base = typing.get_args(base)[0]
        parser.add_argument(*names, type=base, default=f.default,
                            nargs=f.metadata.get("nargs"),
                            help=f"{help_text} (default: {f.default})")
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model, as vLLM's `vllm serve MODEL` takes it (or --model)")
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="vLLM's flag: prefix caching (the radix cache) is on unless "
                             "--disable-radix-cache")
    parser.add_argument("--schedule-low-priority-values-first", action="store_true",
                        help="SGLang's flag: lower priority values first is radixflow's rule "
                             "(SGLang's default runs higher values first)")
    parser.add_argument("--task", choices=("generate", "embed"), default=None,
                        help="vLLM's flag: embed is --is-embedding")
    parser.add_argument("--generation-config", choices=tuple(_GENERATION_CONFIG), default=None,
                        help="vLLM's flag: auto is --sampling-defaults model, vllm is "
                             "--sampling-defaults openai")
    if parser.epilog is None:
        parser.epilog = MODELS_EPILOG


def args_from_flags(cls: type, ns: argparse.Namespace) -> Any:
    """The ServerArgs of parsed flags."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
    tag = getattr(ns, "model_tag", None)
    if tag is not None:
        if values["model"] is not None and values["model"] != tag:
            raise ValueError(f"two models given: {tag!r} and --model {values['model']!r}")
        values["model"] = tag
    if getattr(ns, "enable_prefix_caching", False) and values["disable_radix_cache"]:
        raise ValueError("--enable-prefix-caching contradicts --disable-radix-cache")
    task = getattr(ns, "task", None)
    if task == "generate" and values["is_embedding"]:
        raise ValueError("--task generate contradicts --is-embedding")
    if task == "embed":
        values["is_embedding"] = True
    peer = getattr(ns, "generation_config", None)
    if peer is not None:
        mode = _GENERATION_CONFIG[peer]
        if values["sampling_defaults"] not in (mode, _field_default(cls, "sampling_defaults")):
            raise ValueError(f"--generation-config {peer} contradicts --sampling-defaults "
                             f"{values['sampling_defaults']}")
        values["sampling_defaults"] = mode
    return cls(**values)


def _field_default(cls: type, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)
