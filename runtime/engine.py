"""Engine: the scheduler driven in-process by a background thread.

`generate` takes the same arguments as the native /generate body and returns the same JSON
shapes, so tests, offline jobs and the DSL's in-process backend see exactly what an HTTP
client of `radixflow serve` sees: the same parsing and response building (native_api), the
same `Detokenizer` the detokenizer process runs, the same rejection errors.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

from .detokenize import Detokenizer
from .errors import InvalidRequest, ServerUnavailable
from .ipc import LocalInbox
from .messages import AbortReq, FlushCacheDone, FlushCacheReq, GenerateReq, Message, ReqTextOut
from .native_api import ParsedGenerate, ResponseBuilder, parse_generate, raise_if_rejected
from .scheduler.scheduler import Scheduler
from .server_args import ServerArgs

logger = logging.getLogger(__name__)

_SHUTDOWN = object()


class _Failure:
    def __init__(self, message: str):
        self.message = message


@dataclasses.dataclass
class _Pending:
    outputs: queue.Queue  # ReqTextOut | _Failure, consumed by the caller's thread
    stream: bool
    held: list[ReqTextOut] = dataclasses.field(default_factory=list)


class Engine:
    """An in-process radixflow runtime.

    Parameters are ServerArgs fields (`model=None` is the default SmolLM2-135M-Instruct).

    Raises ValueError for an unknown or invalid argument.
    """

    def __init__(self, model: str | None = None, **kwargs: Any):
        known = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown Engine argument(s) {unknown}; "
                             "see ServerArgs for the options")
        self.args = ServerArgs(model=model, **kwargs)
        self.scheduler = Scheduler(self.args)
        self.tokenizer = self.scheduler.tokenizer
        self.model_info = self.scheduler.model_info()
        self._inbox = LocalInbox()
        self._detokenizer = Detokenizer(self.tokenizer)  # used by the scheduler thread only
        self._pending: dict[str, _Pending] = {}
        self._control: queue.Queue = queue.Queue()  # replies to flush_cache
        self._lock = threading.Lock()
        self._failed: str | None = None
        self._thread = threading.Thread(target=self._loop, name="radixflow-engine", daemon=True)
        self._thread.start()

    # ---- public API ----

    def generate(self, text: str | list[str] | None = None,
                 sampling_params: dict | list | None = None,
                 *, input_ids: list[int] | list[list[int]] | None = None,
                 return_logprob: bool = False, logprob_start_len: int | None = None,
                 top_logprobs_num: int | None = None, return_text_in_logprobs: bool = False,
                 stream: bool = False, rid: str | list[str] | None = None,
                 ) -> dict | list[dict] | Iterator[dict]:
        """Generate like POST /generate: a dict (a list for a batch or n > 1), or an iterator
        of stream events when stream=True. Raises InvalidRequest for a bad request."""
        body = {"text": text, "input_ids": input_ids, "sampling_params": sampling_params,
                "return_logprob": return_logprob, "logprob_start_len": logprob_start_len,
                "top_logprobs_num": top_logprobs_num,
                "return_text_in_logprobs": return_text_in_logprobs, "stream": stream, "rid": rid}
        return self.generate_from_body({k: v for k, v in body.items() if v is not None})

    def generate_from_body(self, body: dict) -> dict | list[dict] | Iterator[dict]:
        parsed = parse_generate(body, self.tokenizer, self.scheduler.context_len,
                                vocab_size=self.scheduler.runner.vocab_size)
        if parsed.stream:
            if parsed.is_batch:
                raise InvalidRequest("streaming is supported for a single prompt with n=1",
                                     param="stream")
            return self._stream(parsed)
        builders = self._submit(parsed)
        try:
            for builder in builders:
                while not builder.finished:
                    self._next_output(builder)
        finally:
            self._forget(parsed.reqs)
        raise_if_rejected(builders)
        return parsed.response([b.result() for b in builders])

    def abort(self, rid: str) -> None:
        self._inbox.put(AbortReq(rid=rid))

    def flush_cache(self) -> bool:
        self._inbox.put(FlushCacheReq())
        return self._control.get(timeout=60)

    def stats(self) -> dict:
        msg = self.scheduler.stats_message()
        return {f: getattr(msg, f) for f in msg.__struct_fields__}

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(_SHUTDOWN)
            self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- request plumbing ----

    def _submit(self, parsed: ParsedGenerate) -> list[ResponseBuilder]:
        if self._failed is not None:
            raise ServerUnavailable(f"the engine stopped: {self._failed}")
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
        try:
            while True:
                msgs = self._inbox.recv_batch(None if self.scheduler.is_idle else 0)
                if any(m is _SHUTDOWN for m in msgs):
                    return
                # As in the server, the detokenizer learns of a request before the scheduler.
                # NOTE: unlike the server's, it is not told of aborts: a caller may still wait
                # for the aborted request's last output (abort by rid).
                for msg in msgs:
                    if isinstance(msg, GenerateReq):
                        self._detokenize(msg)
                for out in self.scheduler.step(msgs):
                    self._detokenize(out)
        except Exception as exc:  # the loop must not die silently: fail every waiter
            logger.exception("engine loop failed")
            self._failed = f"{type(exc).__name__}: {exc}"
            with self._lock:
                for pending in self._pending.values():
                    pending.outputs.put(_Failure(self._failed))

    def _detokenize(self, msg: Message) -> None:
        texts, passed_on = self._detokenizer.handle(msg)
        if isinstance(passed_on, FlushCacheDone):
            self._control.put(passed_on.success)
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
