"""The sitecustomize.py that bench/request_path.py puts on the PYTHONPATH of the server it starts
(copied to a temporary folder; never imported from here).

Every process of the server (HTTP, scheduler, detokenizer: spawned interpreters, so each runs
this at start-up) profiles every Python call of every thread and records the file of its code
while a control byte says so: 0 off, 1 on, 2 write what was seen to <out>/<pid>.json. On the
first call a thread makes in a window it also records, apart, the files of the frames it is
inside (a loop that was already running when the window opened is on the request's path too). The
control byte is a shared file mapped into memory, so no thread waits on a signal or a socket.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import sys
import threading
import time

CONTROL = os.environ.get("RADIXFLOW_PATH_CONTROL")
OUT = os.environ.get("RADIXFLOW_PATH_OUT")
OFF, ON, DUMP = 0, 1, 2


def _install() -> None:
    with open(CONTROL, "r+b") as f:  # type: ignore[arg-type]
        control = mmap.mmap(f.fileno(), 1)
    called: set[str] = set()
    stacked: set[str] = set()
    walked: set[int] = set()

    def hook(frame, event, arg) -> None:
        if control[0] != ON:
            return
        if event == "call":
            called.add(frame.f_code.co_filename)
        thread = threading.get_ident()
        if thread not in walked:  # the frames this thread was already inside
            walked.add(thread)
            frame = frame.f_back if event == "call" else frame
            while frame is not None:
                stacked.add(frame.f_code.co_filename)
                frame = frame.f_back

    def dump_when_asked() -> None:
        while control[0] != DUMP:
            time.sleep(0.02)
        record = {"pid": os.getpid(), "name": multiprocessing.current_process().name,
                  "argv": sys.argv, "called": sorted(called), "stacked": sorted(stacked)}
        path = os.path.join(OUT, f"{os.getpid()}.json")  # type: ignore[arg-type]
        with open(path + ".part", "w") as f:
            json.dump(record, f)
        os.replace(path + ".part", path)

    open(os.path.join(OUT, f"{os.getpid()}.pid"), "w").close()  # type: ignore[arg-type]
    threading.Thread(target=dump_when_asked, name="request-path-dump", daemon=True).start()
    sys.setprofile(hook)
    threading.setprofile(hook)


if CONTROL and OUT:
    _install()
