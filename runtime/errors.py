"""User-facing errors. Each maps to an HTTP 4xx in the server's one exception handler."""

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
