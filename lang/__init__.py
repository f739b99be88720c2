"""radixflow: structured LLM programs over a prefix-sharing runtime.

    import radixflow as rf

    @rf.function
    def qa(s, question):
        s += rf.user(question)
        s += rf.assistant(rf.gen("answer", max_tokens=64))

    rf.set_default_backend(rf.Endpoint("http://127.0.0.1:30000"))
    print(qa.run(question="What is 2 + 2?")["answer"])

`import radixflow` does not import torch: rf.Engine and rf.Runtime load the runtime on use.
"""

from __future__ import annotations

from typing import Any

from . import errors
from .backends.base import Backend, get_default_backend, set_default_backend
from .backends.endpoint import Endpoint
from .backends.openai import OpenAI
from .chat_template import ChatTemplate
from .errors import (
    BackendError,
    BranchError,
    ForkError,
    GrammarError,
    InvalidRequest,
    ProgramError,
    RadixflowError,
    ServerUnavailable,
    TraceError,
    UnsupportedFeature,
    VariableNotFound,
)
from .function import Program, function
from .graph import Graph
from .ir import (
    GenParams,
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    select,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from .program import execute_program
from .state import ForkGroup, ProgramState

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendError",
    "BranchError",
    "ChatTemplate",
    "Endpoint",
    "Engine",
    "ForkError",
    "ForkGroup",
    "GenParams",
    "GrammarError",
    "Graph",
    "InvalidRequest",
    "OpenAI",
    "Program",
    "ProgramError",
    "ProgramState",
    "RadixflowError",
    "Runtime",
    "ServerUnavailable",
    "TraceError",
    "UnsupportedFeature",
    "VariableNotFound",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "errors",
    "execute_program",
    "function",
    "gen",
    "get_default_backend",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
]

_LAZY = {"Engine": ".backends.engine", "Runtime": ".backends.runtime"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'radixflow' has no attribute {name!r}")
