"""Engine: the scheduler driven in-process by a background thread (`radixflow.Engine`).

It is SGLang's offline engine (`generate(prompt, sampling_params, ...)`, `async_generate`,
`get_server_info`, `flush_cache`, sessions, `shutdown`, a context manager) and a backend for
DSL programs (`rf.set_default_backend(engine)`): `generate_from_body` takes a native /generate
body and returns the same JSON shapes, so tests, offline jobs and programs see exactly what an
HTTP client of `radixflow serve` sees: the same parsing (the model's sampling defaults too) and
response building (native_api, response_builder), the same `Detokenizer` the detokenizer
process runs, the same rejections.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

from .detokenize import Detokenizer
from .engine_encode import run_encode
from .errors import InvalidRequest, ServerUnavailable
from .generate_api import GenerateAPI, prefill_only
from .ipc import LocalInbox
from .messages import (
    AbortReq,
    FlushCacheDone,
    FlushCacheReq,
    GenerateReq,
    Message,
    OpenSessionDone,
    ReqTextOut,
)
from .model_loader.generation_defaults import defaults_of
from .native_api import ParsedGenerate, describe_model, parse_generate
from .program import run_program_locally
from .response_builder import ResponseBuilder, raise_if_rejected
from .server_args import server_args_from
from .session_requests import parse_close_session, parse_open_session
from .version import VERSION

logger = logging.getLogger(__name__)

_SHUTDOWN = object()


class _Failure(NamedTuple):
    message: str


@dataclasses.dataclass
class _Pending:
    outputs: queue.Queue  # ReqTextOut | _Failure, consumed by the caller's thread
    stream: bool
    held: list[ReqTextOut] = dataclasses.field(default_factory=list)


class Engine(GenerateAPI):
    """An in-process runtime: `Engine(model_path=None, **server_args)`, ServerArgs fields as
    keywords (`model=` is `model_path=`; None: SmolLM2-135M-Instruct); ValueError if one is bad."""

    def __init__(self, model_path: str | None = None, **server_args: Any):
        from .distributed.launch import TPWorkers
        from .scheduler.scheduler import Scheduler  # torch: only when an engine starts

        self.args = server_args_from(model_path, server_args, who="Engine")
        # --tp-size > 1: rank 0 is this process, ranks 1.. are subprocesses
        self._tp_workers = TPWorkers.start(self.args)
        self.args = self._tp_workers.args
        try:
            self.scheduler = Scheduler.from_args(self.args)
        except BaseException:
            self._tp_workers.stop()
            raise
        self.tokenizer = self.scheduler.tokenizer
        self.model_info = describe_model(self.scheduler.model_info(), self.tokenizer,
                                         tokenizer_path=self.args.tokenizer)
        self._inbox = LocalInbox()
        # Fed the scheduler's outputs only, as the detokenizer process is; the thread's own.
        self._detokenizer = Detokenizer(self.tokenizer)
        self._pending: dict[str, _Pending] = {}
        self._control: queue.Queue = queue.Queue()  # replies to flush_cache
        self._opening: dict[str, queue.Queue] = {}  # session id -> its open_session's reply
        self._lock = threading.Lock()
        self._failed: str | None = None
        self._thread = threading.Thread(target=self._loop, name="radixflow-engine", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"Engine(model_path={self.model_info.get('model_path')!r})"

    # ---- public API (generate and async_generate: GenerateAPI) ----

    def generate_from_body(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        parsed = parse_generate(body, self.tokenizer, self.scheduler.context_len,
                                vocab_size=self.scheduler.runner.vocab_size,
                                reasoning=self.scheduler.reasoning.parser,
                                priority_scheduling=self.args.enable_priority_scheduling,
                                sampling_defaults=defaults_of(self.model_info))
        if parsed.stream:
            if parsed.is_batch:
                raise InvalidRequest("streaming is supported for a single prompt with n=1",
                                     param="stream")
            return self._stream(parsed)
        builders = self.run_to_end(parsed)
        raise_if_rejected(builders)
        return parsed.response([b.result() for b in builders])

    def encode(self, prompt: Any, *, dimensions: int | None = None) -> dict | list[dict]:
        """Embed a text, texts or token ids (is_embedding=True): /encode's answer."""
        return run_encode(self, prompt, dimensions)

    def run_program(self, program: dict, *, stream: bool = False,
                    on_text: Any = None) -> dict:
        """Run a /program body (a straight-line stretch of a DSL program) in this process."""
        return run_program_locally(self.generate_from_body, program, stream=stream,
                                   on_text=on_text)

    def cache_prefix(self, text: str) -> None:
        """Prefill `text` into the prefix cache without generating."""
        self.generate_from_body(prefill_only(text))

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def abort(self, rid: str) -> None:
        self._inbox.put(AbortReq(rid=rid))

    def flush_cache(self) -> bool:
        self._inbox.put(FlushCacheReq())
        return self._control.get(timeout=60)

    def open_session(self, capacity_of_str_len: int, session_id: str | None = None, *,
                     timeout: float | None = None, streaming: bool | None = None) -> str:
        """Open a session (SGLang's `Engine.open_session`) and return its id (`session_id`, or
        a new one). A request sent with `session_params={"id": session_id, "rid": rid}`
        continues request `rid` of the session: its prompt is rid's prompt and output, then its
        own tokens, which are all the client sends (see runtime/scheduler/sessions.py).
        `capacity_of_str_len`: the most tokens one request of the session may hold, history
        included; `timeout`: seconds without a new request after which the session closes.
        Raises InvalidRequest if a session with that id is open (or for a bad argument)."""
        msg = parse_open_session({"capacity_of_str_len": capacity_of_str_len,
                                  "session_id": session_id, "timeout": timeout,
                                  "streaming": streaming})
        self._check_running()
        reply: queue.Queue = queue.Queue(maxsize=1)
        with self._lock:
            if msg.session_id in self._opening:
                raise InvalidRequest(f"session {msg.session_id!r} is being opened",
                                     param="session_id")
            self._opening[msg.session_id] = reply
        try:
            self._inbox.put(msg)
            try:
                done = reply.get(timeout=60)
            except queue.Empty:
                raise ServerUnavailable("the engine did not answer open_session") from None
        finally:
            with self._lock:
                self._opening.pop(msg.session_id, None)
        if isinstance(done, _Failure):
            raise ServerUnavailable(f"the engine stopped: {done.message}")
        if not done.success:
            raise InvalidRequest(done.message or "the session was not opened",
                                 param="session_id")
        return msg.session_id

    def close_session(self, session_id: str) -> None:
        """Close a session: its token history is forgotten; requests of it that still run
        finish normally. Closing a session that is not open does nothing (as in SGLang)."""
        msg = parse_close_session({"session_id": session_id})
        self._check_running()
        self._inbox.put(msg)

    def stats(self) -> dict:
        msg = self.scheduler.stats_message()
        return {f: getattr(msg, f) for f in msg.__struct_fields__}

    def get_server_info(self) -> dict:
        """SGLang's: the engine's arguments (no API key), the model, the version and the
        scheduler's load (`stats`), as /get_server_info gives them for a server."""
        return {**self.args.public_info(), "model_info": self.model_info, "version": VERSION,
                **self.stats()}

    def shutdown(self) -> None:
        """Stop the scheduler thread; later calls raise ServerUnavailable."""
        if self._thread.is_alive():
            self._inbox.put(_SHUTDOWN)
            self._thread.join(timeout=30)
        self._tp_workers.stop()
        self._failed = self._failed or "it was shut down"

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- request plumbing ----

    def _check_running(self) -> None:
        if self._failed is not None:
            raise ServerUnavailable(f"the engine stopped: {self._failed}")

    def _submit(self, parsed: ParsedGenerate) -> list[ResponseBuilder]:
        self._check_running()
        builders = parsed.builders(self.tokenizer)
        with self._lock:
            for req in parsed.reqs:
                if req.rid in self._pending:
                    raise InvalidRequest(f"request id {req.rid!r} is already running", param="rid")
            for req in parsed.reqs:
                self._pending[req.rid] = _Pending(queue.Queue(), stream=parsed.stream)
        for req in parsed.reqs:
            self._inbox.put(req)
        return builders

    def run_to_end(self, parsed: ParsedGenerate) -> list[ResponseBuilder]:
        builders = self._submit(parsed)  # and wait until each finished
        try:
            for builder in builders:
                while not builder.finished:
                    self._next_output(builder)
        finally:
            self._forget(parsed.reqs)
        return builders

    def _next_output(self, builder: ResponseBuilder, block: bool = True) -> bool:
        pending = self._pending[builder.req.rid]
        try:
            item = pending.outputs.get(block=block)
        except queue.Empty:
            return False
        if isinstance(item, _Failure):
            raise ServerUnavailable(f"the engine stopped: {item.message}")
        for out in item if isinstance(item, list) else [item]:
            builder.add(out)
        return True

    def _stream(self, parsed: ParsedGenerate) -> Iterator[dict]:
        (builder,) = self._submit(parsed)
        finished = False
        try:
            while not builder.finished:
                self._next_output(builder)
                while self._next_output(builder, block=False):  # merge queued steps
                    pass
                raise_if_rejected([builder])
                yield builder.event()
            finished = True
        finally:
            if not finished:
                self.abort(builder.req.rid)
            self._forget(parsed.reqs)

    def _forget(self, reqs: list[GenerateReq]) -> None:
        with self._lock:
            for req in reqs:
                self._pending.pop(req.rid, None)

    # ---- the scheduler thread ----

    def _loop(self) -> None:
        self.scheduler.use_device_here()
        try:
            while True:
                msgs = self._inbox.recv_batch(None if self.scheduler.is_idle else 0)
                if any(m is _SHUTDOWN for m in msgs):
                    self.scheduler.shutdown()
                    return
                for out in self.scheduler.step(msgs):
                    self._detokenize(out)
        except Exception as exc:  # the loop must not die silently: fail every waiter
            logger.exception("engine loop failed")
            self._failed = f"{type(exc).__name__}: {exc}"
            with self._lock:
                for pending in self._pending.values():
                    pending.outputs.put(_Failure(self._failed))
                for reply in self._opening.values():
                    reply.put(_Failure(self._failed))

    def _detokenize(self, msg: Message) -> None:
        texts, passed_on = self._detokenizer.handle(msg)
        if isinstance(passed_on, FlushCacheDone):
            self._control.put(passed_on.success)
        elif isinstance(passed_on, OpenSessionDone):
            with self._lock:
                reply = self._opening.get(passed_on.session_id)
            if reply is not None:
                reply.put(passed_on)
        if texts:
            self._deliver(texts)

    def _deliver(self, texts: list[ReqTextOut]) -> None:
        with self._lock:
            for out in texts:
                pending = self._pending.get(out.token.rid)
                if pending is None:  # the caller went away (aborted stream)
                    continue
                if pending.stream:
                    pending.outputs.put(out)
                    continue
                # NOTE: a non-stream caller is woken once, at the end: waking its thread every
                # step costs the decode loop several ms a step (it competes for the 2 cores).
                pending.held.append(out)
                if out.token.finish is not None:
                    pending.outputs.put(pending.held)
