"""Endpoint: a radixflow (or SGLang) server over its native HTTP API."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

from radixflow.runtime.generate_api import GenerateAPI, prefill_only
from radixflow.runtime.program import run_program_locally

from ..chat_template import ChatTemplate, template_from_model_info
from ..errors import BackendError, ContextTooLong, InvalidRequest, ServerUnavailable
from .base import OnText

logger = logging.getLogger(__name__)

class Endpoint(GenerateAPI):
    """A server at `url` speaking radixflow's native API (SGLang's /generate wire format).

    `generate(prompt, sampling_params, ...)` and `async_generate` take SGLang's Engine calls
    (radixflow.runtime.generate_api); `generate_from_body(body)` posts a /generate body as is.

    `api_key` is sent as a Bearer token. Straight-line stretches go to POST /program; against
    a server without that route (SGLang) they run here, one /generate per gen. `timeout` bounds
    each request in seconds (None: wait as long as generation takes). `chat_template` overrides
    the template the server reports. `verify` is requests' TLS check for an https URL (False,
    or a CA bundle's path). Raises ServerUnavailable (naming the URL) if the server cannot be
    reached.
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float | None = None,
                 use_program: bool = True, chat_template: str | None = None,
                 verify: bool | str | None = None):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.verify = verify
        self.timeout = timeout
        self._local = threading.local()
        self._program_route: bool | None = None if use_program else False
        self.model_info: dict = self._request("GET", "/get_model_info")
        self.chat_template = (ChatTemplate(chat_template) if chat_template
                              else template_from_model_info(self.model_info))

    def __repr__(self) -> str:
        return f"Endpoint({self.url!r}, model={self.model_info.get('model_path')!r})"

    # ---- backend protocol ----

    def generate_from_body(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        if body.get("stream"):
            return self._stream("/generate", body)
        return self._request("POST", "/generate", body)

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: OnText | None = None) -> dict:
        if not stream and self._program_route is not False:
            try:
                result = self._request("POST", "/program", program)
                self._program_route = True
                return result
            except BackendError as exc:
                if exc.status_code not in (404, 405, 501):
                    raise
                logger.info("%s has no /program route; running programs client-side", self.url)
                self._program_route = False
        return run_program_locally(self.generate_from_body, program, stream=stream,
                                   on_text=on_text)

    def cache_prefix(self, text: str) -> None:
        self._request("POST", "/generate", prefill_only(text))

    def flush_cache(self) -> None:
        self._request("POST", "/flush_cache", None, want_json=False)

    def server_info(self) -> dict:
        return self._request("GET", "/server_info")

    def get_server_info(self) -> dict:
        """SGLang's name for `server_info` (Engine and Runtime take the same calls)."""
        return self.server_info()

    def open_session(self, capacity_of_str_len: int, session_id: str | None = None, *,
                     timeout: float | None = None) -> str:
        """SGLang's POST /open_session: the session id. Requests sent with
        `session_params={"id": session_id, "rid": rid}` continue request `rid` of the session
        without sending its tokens again (radixflow.Engine.open_session has the details)."""
        body: dict[str, Any] = {"capacity_of_str_len": capacity_of_str_len,
                                "session_id": session_id}
        if timeout is not None:
            body["timeout"] = timeout
        return self._request("POST", "/open_session", body)

    def close_session(self, session_id: str) -> None:
        self._request("POST", "/close_session", {"session_id": session_id}, want_json=False)

    def shutdown(self) -> None:
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()

    # ---- HTTP ----

    def _session(self):
        session = getattr(self._local, "session", None)
        if session is None:
            import requests

            session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=16)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            if self.api_key:
                session.headers["Authorization"] = f"Bearer {self.api_key}"
            if self.verify is not None:
                session.verify = self.verify
            self._local.session = session
        return session

    def _send(self, method: str, path: str, body: Any, *, stream: bool = False):
        import requests

        url = self.url + path
        try:
            resp = self._session().request(
                method, url, data=None if body is None else json.dumps(body),
                headers=None if body is None else {
                    "Content-Type": "application/json; charset=utf-8"},
                stream=stream, timeout=(10.0, self.timeout))
        except requests.ConnectionError as exc:
            raise ServerUnavailable(f"cannot reach the radixflow server at {self.url}: "
                                    f"{type(exc).__name__}") from exc
        except requests.Timeout as exc:
            raise ServerUnavailable(f"the server at {self.url} did not answer {path} within "
                                    f"{self.timeout} s") from exc
        if resp.status_code != 200:
            raise _http_error(resp, url)
        return resp

    def _request(self, method: str, path: str, body: Any = None, *, want_json: bool = True) -> Any:
        resp = self._send(method, path, body)
        if not want_json:
            return resp.text
        try:
            return resp.json()
        except ValueError as exc:
            raise BackendError(f"{path} answered with non-JSON: {resp.text[:200]!r}",
                               status_code=resp.status_code, url=self.url) from exc

    def _stream(self, path: str, body: dict) -> Iterator[dict]:
        resp = self._send("POST", path, body, stream=True)
        with resp:
            for line in resp.iter_lines(decode_unicode=False):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                event = json.loads(payload)
                if "error" in event and "text" not in event:
                    raise BackendError(_message(event), status_code=500, url=self.url)
                yield event


def _message(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            return str(err.get("message", err))
        if err is not None:
            return str(err)
    return str(body)


def _http_error(resp: Any, url: str) -> Exception:
    try:
        body = resp.json()
    except ValueError:
        body = resp.text[:500]
    message = _message(body)
    code = body.get("error", {}).get("code") if isinstance(body, dict) and isinstance(
        body.get("error"), dict) else None
    if resp.status_code == 400:
        cls = ContextTooLong if code == "context_length_exceeded" else InvalidRequest
        return cls(message)
    if resp.status_code == 503:
        return ServerUnavailable(f"{message} (server at {url})")
    return BackendError(message, status_code=resp.status_code, url=url)
