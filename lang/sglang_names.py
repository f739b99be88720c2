"""SGLang's frontend names that radixflow's own do not already cover, so that a program written
for `import sglang as sgl` runs as `import radixflow as sgl`: RuntimeEndpoint, gen_int and
gen_string, the select methods as values, flush_cache / get_server_info on the default
backend; image and video are refused (radixflow serves text models)."""

from __future__ import annotations

from typing import Any

from .backends.default import get_default_backend
from .backends.endpoint import Endpoint
from .errors import UnsupportedFeature
from .ir import gen

# SGLang passes these objects as select(..., choices_method=); here they are the methods' names.
token_length_normalized = "token_length_normalized"
greedy_token_selection = "greedy_token_selection"
unconditional_likelihood_normalized = "unconditional_likelihood_normalized"


class RuntimeEndpoint(Endpoint):
    """SGLang's RuntimeEndpoint: an Endpoint at `base_url`. The chat template is the model's
    own, from the server; SGLang's named client-side templates are refused."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 verify: bool | str | None = None, chat_template_name: str | None = None):
        if chat_template_name is not None:
            raise UnsupportedFeature(
                f"chat_template_name={chat_template_name!r}: radixflow renders the model's own "
                "chat template, which the server reports; drop the argument, or pass "
                "Endpoint(url, chat_template=<Jinja source>) to override it")
        super().__init__(base_url, api_key, verify=verify)


def gen_int(name: str | None = None, **kwargs: Any):
    """gen(name, dtype=int, ...): an integer."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any):
    """gen(name, dtype=str, ...): a JSON string literal."""
    return gen(name, dtype=str, **kwargs)


def flush_cache(backend: Any = None) -> Any:
    """Empty the radix cache of `backend` (default: the default backend)."""
    return _call(backend, "flush_cache")


def get_server_info(backend: Any = None) -> dict:
    """The server's (or Engine's) configuration and state."""
    return _call(backend, "get_server_info")


def _call(backend: Any, method: str) -> Any:
    backend = backend or get_default_backend()
    fn = getattr(backend, method, None)
    if fn is None:
        raise UnsupportedFeature(f"{method}: {type(backend).__name__} has no radix cache of "
                                 "its own to ask (Endpoint, Runtime and Engine have)")
    return fn()


def image(path: Any):
    raise UnsupportedFeature("rf.image: radixflow serves text models only")


def video(path: Any, num_frames: int = 0):
    raise UnsupportedFeature("rf.video: radixflow serves text models only")
