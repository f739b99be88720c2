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
from typing import Any

__version__ = "0.1.0"

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
