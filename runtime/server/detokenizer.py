"""Detokenizer process: token deltas from the scheduler -> cumulative, stop-trimmed text.

The tokenizer manager announces each request (its GenerateReq: stop strings and detokenizer
options) on the same socket the scheduler writes to; outputs that overtake their
announcement wait in `pending`. Stats and flush acknowledgements pass through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import zmq

from ..detokenize import IncrementalDetokenizer
from ..messages import (
    AbortReq,
    GenerateReq,
    Message,
    ProcessFailed,
    ReqTextOut,
    ReqTokenOut,
    TextBatchOut,
    TokenBatchOut,
)
from .ipc import PullSocket, PushSocket

logger = logging.getLogger(__name__)

PENDING_TIMEOUT_S = 60.0
FORGET_ABORTED = 10_000  # how many aborted rids to remember, to drop their late outputs


class TokenizerJsonDecoder:
    """`decode` of a tokenizer.json through the `tokenizers` library.

    Decoding is all this process needs, and skipping the transformers import saves seconds
    of start-up CPU that the scheduler, loading the model at the same time, can use.
    (Equal to the transformers fast tokenizer's decode without clean-up, which is what
    IncrementalDetokenizer asks for.)
    """

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int], skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("TokenizerJsonDecoder does not clean up tokenization spaces")
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_decoder(tokenizer_path: str) -> Any:
    path = Path(tokenizer_path) / "tokenizer.json"
    if path.is_file():
        return TokenizerJsonDecoder(path)
    from .tokenizer_manager import load_tokenizer

    return load_tokenizer(tokenizer_path)


class Detokenizer:
    """The process's state, kept free of sockets so it can be tested directly."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}
        self.pending: dict[str, tuple[float, list[ReqTokenOut]]] = {}
        self.aborted: OrderedDict[str, None] = OrderedDict()

    def handle(self, msg: Message) -> tuple[list[ReqTextOut], Message | None]:
        """(text outputs, a message to forward as is)."""
        if isinstance(msg, GenerateReq):
            s = msg.sampling
            self.states[msg.rid] = IncrementalDetokenizer(
                self.tokenizer, stop=list(s.stop), skip_special_tokens=s.skip_special_tokens,
                no_stop_trim=s.no_stop_trim, prompt_ids=msg.input_ids)
            _, early = self.pending.pop(msg.rid, (0.0, []))
            return [self._text_out(o) for o in early], None
        if isinstance(msg, AbortReq):
            self.states.pop(msg.rid, None)
            self.pending.pop(msg.rid, None)
            self.aborted[msg.rid] = None
            if len(self.aborted) > FORGET_ABORTED:
                self.aborted.popitem(last=False)
            return [], None
        if isinstance(msg, TokenBatchOut):
            outs = []
            for out in msg.outputs:
                if out.rid in self.states:
                    outs.append(self._text_out(out))
                elif out.rid not in self.aborted:
                    self.pending.setdefault(out.rid, (time.monotonic(), []))[1].append(out)
            self._expire_pending()
            return outs, None
        return [], msg

    def _text_out(self, out: ReqTokenOut) -> ReqTextOut:
        det = self.states[out.rid]
        det.append(out.new_ids)
        if out.finish is not None:
            det.finish()
            del self.states[out.rid]
        return ReqTextOut(token=out, text=det.text)

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for rid in [r for r, (t, _) in self.pending.items() if now - t > PENDING_TIMEOUT_S]:
            logger.warning("dropping outputs of request %s: it was never announced", rid)
            del self.pending[rid]


def run_detokenizer(tokenizer_path: str, in_addr: str, out_addr: str, ready: Any) -> None:
    """Process entry point. `ready` is a multiprocessing Connection; it gets True once bound."""
    tokenizer = load_decoder(tokenizer_path)
    ctx = zmq.Context()
    pull = PullSocket(ctx, in_addr, bind=True)
    push = PushSocket(ctx, out_addr)
    detok = Detokenizer(tokenizer)
    ready.send(True)
    ready.close()
    try:
        while True:
            batch = [pull.recv()] + pull.drain()
            texts: list[ReqTextOut] = []
            for msg in batch:
                outs, forward = detok.handle(msg)
                texts.extend(outs)
                if forward is not None:
                    if texts:
                        push.send(TextBatchOut(outputs=texts))
                        texts = []
                    push.send(forward)
            if texts:
                push.send(TextBatchOut(outputs=texts))
    except Exception as exc:  # report, then die: the server must not hang on a dead process
        logger.exception("detokenizer failed")
        push.send(ProcessFailed(process="detokenizer", message=f"{type(exc).__name__}: {exc}"))
        raise
