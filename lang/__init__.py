"""radixflow: structured LLM programs over a prefix-sharing runtime.

    import radixflow as rf

    @rf.function
    def qa(s, question):
        s += rf.user(question)
        s += rf.assistant(rf.gen("answer", max_tokens=64))

    rf.set_default_backend(rf.Endpoint("http://127.0.0.1:30000"))
    print(qa.run(question="What is 2 + 2?")["answer"])

Every public name is loaded on first use, so `import radixflow` (and importing the runtime,
whose package sits under this one) runs no DSL code and does not import torch.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

__version__ = "0.1.0"


def _put_checkout_root_last() -> None:
    """In a source checkout (`python -m pytest`, `python -m bench.x` run from its root) the root
    sits first on sys.path, so its kernels/ folder (radixflow.kernels) would also import as a
    top-level `kernels` and hide PyPI's `kernels` package, which transformers 5 imports when it
    loads any config. Behind site-packages the root still serves `bench`, and hides nothing."""
    here = Path(__file__).resolve().parent
    if here.name != "lang":  # an installed wheel: no checkout root
        return
    root = here.parent
    entries = [p for p in sys.path if Path(p or ".").resolve() == root]
    for entry in entries:
        sys.path.remove(entry)
    sys.path.extend(entries[:1])


_put_checkout_root_last()

# module (relative to this package, or absolute) -> the public names it defines
_EXPORTS: dict[str, tuple[str, ...]] = {
    ".backends.base": ("Backend",),
    ".backends.default": ("get_default_backend", "set_default_backend"),
    ".backends.endpoint": ("Endpoint",),
    ".backends.openai": ("OpenAI",),
    ".backends.runtime": ("Runtime",),
    ".chat_template": ("ChatTemplate",),
    ".errors": ("BackendError", "BranchError", "ForkError", "GrammarError", "InvalidRequest",
                "ProgramError", "RadixflowError", "ServerUnavailable", "TraceError",
                "UnsupportedFeature", "VariableNotFound"),
    ".fork": ("ForkGroup",),
    ".graph": ("Graph",),
    ".ir": ("assistant", "assistant_begin", "assistant_end", "gen", "select",
            "system", "system_begin", "system_end", "user", "user_begin", "user_end"),
    ".params": ("GenParams",),
    ".program": ("Program", "function"),
    ".sglang_names": ("RuntimeEndpoint", "flush_cache", "gen_int", "gen_string",
                      "get_server_info", "greedy_token_selection", "image",
                      "token_length_normalized", "unconditional_likelihood_normalized", "video"),
    ".state": ("ProgramState",),
    ".tools": ("Tool", "call_tools"),
    "radixflow.runtime.engine": ("Engine",),
    "radixflow.runtime.program": ("execute_program",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = ("errors",)

__all__ = sorted([*_MODULE_OF, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'radixflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
