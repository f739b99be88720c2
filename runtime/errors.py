"""User-facing errors. Each maps to an HTTP status in the server's one exception handler."""

from __future__ import annotations


class RadixflowError(Exception):
    """Base class of every error radixflow raises on purpose."""

    status_code = 500


class InvalidRequest(RadixflowError, ValueError):
    """The request itself is wrong: a bad field, an absurd value, an empty prompt."""

    status_code = 400

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class ContextTooLong(InvalidRequest):
    """Prompt (plus requested output) does not fit the model's context."""


class GrammarError(InvalidRequest):
    """A regex / JSON Schema / EBNF constraint that is invalid, unsupported or too big."""


class ModelNotFound(RadixflowError, FileNotFoundError):
    """A model path or name that cannot be resolved to weights."""

    status_code = 404


class ModelDownloadError(RadixflowError, RuntimeError):
    """The default model could not be fetched or failed its integrity check."""


class ServerUnavailable(RadixflowError, ConnectionError):
    """The server cannot be reached, or one of its processes died."""

    status_code = 503


def rejection(finish_reason: dict | None) -> RadixflowError | None:
    """The error for a request the scheduler refused, from its `finish_reason`: an
    InvalidRequest (400) for a bad request (a grammar that fails to compile, a prompt too
    long), a RadixflowError (500) for a failure inside; None when it was not refused
    (finished, or aborted by the client, which has no status code)."""
    if finish_reason is None or finish_reason["type"] != "abort":
        return None
    status = finish_reason.get("status_code")
    if status is None:
        return None
    message = finish_reason.get("message") or "the request was aborted"
    return RadixflowError(message) if status >= 500 else InvalidRequest(message)


class Fatal(Exception):
    """Marks an error after which this process cannot serve anyone (a broken invariant, a lost
    tensor-parallel rank): per-request failure handling never catches it."""


class InvariantBroken(RadixflowError, Fatal, RuntimeError):
    """The scheduler's own bookkeeping is wrong (a KV slot leaked, a row freed twice): no request
    caused it and none can be trusted after it, so the scheduler process stops with this
    message and a non-zero exit (scheduler/process.py). Raised explicitly, never an `assert`
    (which `python -O` strips)."""


class ServerBusy(RadixflowError):
    """The server is full (a limit such as --max-queued-requests or --max-connections): a 503
    whose response carries `Retry-After: <retry_after>` seconds. Nothing is wrong with the
    request; the same one can be sent again later."""

    status_code = 503

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class TooManyOpen(ServerBusy):
    """A cap on things a client keeps open (sessions: --max-open-sessions) is reached: a 429
    with Retry-After; one closing (or timing out) makes room."""

    status_code = 429


class StreamBufferFull(ServerUnavailable):
    """A request's output waiting for its (slow) client passed --max-stream-buffer-bytes, so
    the request was aborted. A ServerUnavailable so that a stream already under way ends with
    an error event, as it does when the server fails."""
