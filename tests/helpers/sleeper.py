"""A child-process entry for launcher tests: report ready, then sleep."""

from __future__ import annotations

import time
from typing import Any


def run(seconds: float, ready: Any) -> None:
    ready.send({"ok": True, "model_info": {"sleeping": True}})
    time.sleep(seconds)
