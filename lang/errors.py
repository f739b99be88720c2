"""Errors the DSL raises. The runtime's typed errors, and the errors a program run reports
(shared with the /program executor), are re-exported so users catch one family."""

from __future__ import annotations

from radixflow.runtime.errors import (
    ContextTooLong,
    GrammarError,
    InvalidRequest,
    RadixflowError,
    ServerUnavailable,
)
from radixflow.runtime.program.errors import (
    BackendError,
    BranchError,
    ForkError,
    ProgramError,
    UnsupportedFeature,
    VariableNotFound,
    error_from_wire,
    error_to_wire,
)

__all__ = [
    "BackendError",
    "BranchError",
    "ContextTooLong",
    "ForkError",
    "GrammarError",
    "InvalidRequest",
    "NoBackendError",
    "ProgramError",
    "RadixflowError",
    "ServerUnavailable",
    "TraceError",
    "UnsupportedFeature",
    "VariableNotFound",
    "error_from_wire",
    "error_to_wire",
]


class TraceError(RadixflowError, RuntimeError):
    """A program could not be traced (e.g. it loops without end on placeholder values)."""


class NoBackendError(RadixflowError, RuntimeError):
    """No backend was given and none was set with `rf.set_default_backend`."""
