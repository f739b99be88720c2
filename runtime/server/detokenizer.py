"""Detokenizer process: token deltas from the scheduler -> cumulative, stop-trimmed text.

It hears only from the scheduler (every replica under --dp-size): a request's first output
says how to decode it, and the scheduler's stop check says where its text is cut.
`Detokenizer` (shared with the in-process Engine) does the work; stats and acknowledgements
pass through unchanged to the HTTP process.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import zmq

from ..detokenize import Detokenizer
from ..ipc import PullSocket, PushSocket
from ..messages import ProcessFailed, ReqTextOut, TextBatchOut

logger = logging.getLogger(__name__)


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
               clean_up_tokenization_spaces: bool = False,
               spaces_between_special_tokens: bool = True) -> str:
        # spaces_between_special_tokens: a slow tokenizer's option, which a fast one ignores
        if clean_up_tokenization_spaces:
            raise ValueError("TokenizerJsonDecoder does not clean up tokenization spaces")
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def load_decoder(tokenizer_path: str) -> Any:
    path = Path(tokenizer_path) / "tokenizer.json"
    if path.is_file():
        return TokenizerJsonDecoder(path)
    from .scheduler_client import load_tokenizer

    return load_tokenizer(tokenizer_path)


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
            batch = pull.recv_batch()
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
