"""The HTTP process's tokenizer, loaded in a thread while the schedulers load the model.

Where the folder's tokenizer class is recorded (runtime/model_loader/tokenizer_class.py) it
loads at once, without torch. On a folder's first start nothing is recorded yet, and asking
transformers' AutoTokenizer here would import torch into this process for its lifetime
(~250 MiB); the scheduler asks it while it loads and records the class, so the thread waits
for that record and loads the recorded class. A record that never comes (a class from the
model's own code, a read-only cache, a scheduler that loads no tokenizer) leaves the load to
`result()`, after the schedulers are ready: AutoTokenizer, as before there were records.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

POLL_S = 0.05


class TokenizerLoad:
    def __init__(self, path: str):
        self.path = path
        self._tokenizer: Any = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tokenizer-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ..model_loader.tokenizer_class import is_recorded
        from .scheduler_client import load_tokenizer

        try:
            while not is_recorded(Path(self.path)):
                if self._stop.wait(POLL_S):
                    return
            self._tokenizer = load_tokenizer(self.path)
        except BaseException as exc:  # (raised again by result())
            self._error = exc

    def result(self) -> Any:
        """The tokenizer (loaded here if the thread found no record by now)."""
        from .scheduler_client import load_tokenizer

        self.cancel()
        if self._error is not None:
            raise self._error
        return self._tokenizer if self._tokenizer is not None else load_tokenizer(self.path)

    def cancel(self) -> None:
        """Stop waiting for a record (a load under way finishes first)."""
        self._stop.set()
        self._thread.join()
