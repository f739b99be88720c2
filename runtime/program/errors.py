"""The errors a program run reports, and their form inside a /program response.

Both sides use them: the executor (server or client) puts an error in the response as
{"type", "message"}; the DSL rebuilds the same class from it.
"""

from __future__ import annotations

from radixflow.runtime.errors import (
    ContextTooLong,
    GrammarError,
    InvalidRequest,
    RadixflowError,
    ServerUnavailable,
)


class VariableNotFound(RadixflowError, KeyError):
    """A program read a variable that no gen/select has produced (yet)."""

    def __init__(self, name: str, defined: list[str]):
        known = ", ".join(repr(n) for n in sorted(defined)) or "none"
        super().__init__(
            f"variable {name!r} is not defined: no gen/select named {name!r} ran before this read "
            f"(defined so far: {known})")
        self.name = name

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class BackendError(RadixflowError, RuntimeError):
    """The backend answered with an error status."""

    def __init__(self, message: str, *, status_code: int = 500, url: str | None = None):
        super().__init__(f"{message} (HTTP {status_code} from {url})" if url else message)
        self.status_code = status_code
        self.url = url


class UnsupportedFeature(RadixflowError, NotImplementedError):
    """The chosen backend cannot do what the program asks (e.g. select over a chat-only API)."""

    status_code = 400


class ProgramError(RadixflowError, RuntimeError):
    """A program of `run_batch` failed; `index` says which, `__cause__` says why."""

    def __init__(self, message: str, *, index: int | None = None):
        super().__init__(message)
        self.index = index


class ProgramCancelled(RadixflowError, RuntimeError):
    """The run was stopped (its client hung up): no generation starts after it."""

    status_code = 499


class BranchError(ProgramError):
    """One branch of `s.fork(n)` failed; the other branches went on."""


class ForkError(ProgramError):
    """`join` over branches of which some failed; `errors` maps branch index -> message."""

    def __init__(self, errors: dict[int, str]):
        detail = "; ".join(f"branch {i}: {msg}" for i, msg in sorted(errors.items()))
        super().__init__(f"{len(errors)} fork branch(es) failed: {detail}")
        self.errors = errors


# Errors that travel inside a /program response keep their class across the wire.
_WIRE_CLASSES: dict[str, type[RadixflowError]] = {
    cls.__name__: cls
    for cls in (InvalidRequest, ContextTooLong, GrammarError, ServerUnavailable, BackendError,
                UnsupportedFeature, VariableNotFound, ProgramError, BranchError)
}


def error_to_wire(exc: BaseException) -> dict:
    """{"type", "message"} for an exception raised while a program ran."""
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return {"type": type(exc).__name__, "message": str(message)}


def error_from_wire(err: dict, *, context: str = "") -> RadixflowError:
    """Rebuild an exception from `error_to_wire` output (unknown types become ProgramError)."""
    kind, message = err.get("type", ""), err.get("message", "program failed")
    if context:
        message = f"{context}: {message}"
    cls = _WIRE_CLASSES.get(kind)
    if cls is None or cls is VariableNotFound:
        return ProgramError(f"{message} ({kind})" if kind else message)
    if cls is BackendError:
        return BackendError(message)
    return cls(message)
