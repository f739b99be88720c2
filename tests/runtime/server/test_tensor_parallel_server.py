"""`radixflow serve --tp-size 2` across two "nodes" (two process trees on 127.0.0.1): it
serves what --tp-size 1 serves, and stops with a message when the other node goes; a node
whose --dist-init-addr nobody answers on, and a --tp-size the model cannot be split by, fail
at start with messages that say so."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import requests
from helpers.live_server import LiveServer, kill_all, maps_torch

from radixflow.runtime.engine import Engine
from radixflow.runtime.ipc import free_port

PROMPTS = ["The quick brown fox", "Once upon a time", "def add(a, b):", "Numbers: 0 1 2"]
GREEDY = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}


def _serve(*flags: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "radixflow.runtime.cli", "serve", *flags],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def test_two_nodes_serve_like_one_then_stop_when_a_node_goes(tiny_model_dir, tmp_path):
    with Engine(str(tiny_model_dir), dtype="float32") as engine:
        expected = [r["output_ids"] for r in engine.generate(PROMPTS, GREEDY)]
    addr = f"127.0.0.1:{free_port()}"
    common = ["--model", str(tiny_model_dir), "--dtype", "float32", "--max-total-tokens", "2048",
              "--tp-size", "2", "--nnodes", "2", "--dist-init-addr", addr,
              "--dist-timeout", "60"]
    with open(tmp_path / "node1.log", "wb") as log1:
        node1 = _serve(*common, "--node-rank", "1", log=log1)
        node0 = None
        try:
            node0 = LiveServer(*common, "--node-rank", "0", log_path=tmp_path / "node0.log",
                               timeout=240)
            got = requests.post(node0.url + "/generate", json={
                "text": PROMPTS, "sampling_params": GREEDY}, timeout=120).json()
            assert [r["output_ids"] for r in got] == expected
            # the launcher checks the split without torch: its HTTP process never loads it
            assert not maps_torch(node0.proc.pid)
            os.killpg(node1.pid, signal.SIGKILL)  # node 1 is gone; node 0 idles
            node1.wait()
            start = time.monotonic()
            code = node0.proc.wait(60)
            assert code != 0 and time.monotonic() - start < 30
            assert "tensor-parallel rank 1 (node 1) has not answered" in node0.log()
        finally:
            if node0 is not None:
                kill_all(node0.children())
                node0.stop(signal.SIGKILL)
            if node1.poll() is None:
                os.killpg(node1.pid, signal.SIGKILL)
                node1.wait()


def test_nobody_at_the_init_addr_times_out(tiny_model_dir, tmp_path):
    log_path = tmp_path / "node1.log"
    with open(log_path, "wb") as log:
        start = time.monotonic()
        proc = _serve("--model", str(tiny_model_dir), "--tp-size", "2", "--nnodes", "2",
                      "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{free_port()}",
                      "--dist-timeout", "1", log=log)
        try:
            code = proc.wait(90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    assert code == 1, text
    assert "rank 1 found nobody at --dist-init-addr" in text and "--dist-timeout 1 s" in text
    assert "Exception raised from" not in text  # c10d's own retries stay quiet
    assert time.monotonic() - start < 60


def test_tp_size_the_model_cannot_split_is_refused(tiny_model_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", "serve", "--model",
                          str(tiny_model_dir), "--tp-size", "3", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "--tp-size 3 cannot split this model" in out.stderr
    assert "its 4 attention heads" in out.stderr and "its 2 KV heads" in out.stderr
