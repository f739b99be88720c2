"""Process life: the CLI, --api-key, a dying child, a dying parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import openai
import pytest
import requests
from helpers.live_server import LiveServer, descendants, kill_all, maps_torch, own_cache, wait_gone

from radixflow.runtime.server_args import ServerArgs

KEY = "s3cret-key"


def run_cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixflow.runtime.cli", *argv],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_serve_help_lists_every_server_arg():
    out = run_cli("serve", "--help").stdout
    for name in ServerArgs.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in out


def test_bad_flag_value_is_a_usage_error():
    r = run_cli("serve", "--max-running-requests", "0")
    assert r.returncode == 2 and "--max-running-requests must be > 0" in r.stderr


def test_missing_model_exits_with_message(tmp_path):
    r = run_cli("serve", "--model", str(tmp_path / "nope"), "--port", "0")
    assert r.returncode == 1 and "nope" in r.stderr


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir, tmp_path_factory):
    """(Its own cache: the folder's first start, no tokenizer class recorded.)"""
    home = tmp_path_factory.mktemp("keyed")
    cache = own_cache(home / "cache")
    srv = LiveServer("--model", str(tiny_model_dir), "--api-key", KEY, "--max-total-tokens",
                     "2048", "--served-model-name", "tiny", log_path=home / "serve.log",
                     env={"RADIXFLOW_CACHE": str(cache)})
    srv.cache = cache
    yield srv
    kill_all(srv.children())
    srv.stop(signal.SIGKILL)


@pytest.mark.parametrize("path, method", [
    ("/generate", "post"), ("/v1/models", "get"), ("/get_model_info", "get"),
    ("/get_server_info", "get"), ("/metrics", "get"), ("/flush_cache", "post"),
    ("/v1/chat/completions", "post"), ("/health_generate", "get"),
])
def test_api_key_required(keyed_server, path, method):
    url = keyed_server.url + path
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = getattr(requests, method)(url, headers=headers, timeout=30)
        assert r.status_code == 401, (path, headers)
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_api_key_accepted(keyed_server):
    assert requests.get(keyed_server.url + "/health", timeout=30).status_code == 200
    auth = {"Authorization": f"Bearer {KEY}"}
    r = requests.post(keyed_server.url + "/generate", headers=auth, timeout=60,
                      json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and "text" in r.json()
    ok = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    assert ok.models.list().data[0].id == "tiny"
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_a_first_start_keeps_torch_out_of_the_http_process(keyed_server):
    """No tokenizer class recorded for the folder: the scheduler asked AutoTokenizer (which
    imports torch) and recorded it; the HTTP process loaded the recorded class."""
    assert list((keyed_server.cache / "tokenizer-classes").glob("*.json"))
    info = requests.get(keyed_server.url + "/get_server_info", timeout=30,
                        headers={"Authorization": f"Bearer {KEY}"}).json()
    assert maps_torch(info["processes"]["scheduler"])  # (the check sees torch where it is)
    assert not maps_torch(keyed_server.proc.pid)


def test_dead_scheduler_fails_requests_and_stops_server(keyed_server):
    """Runs last in this module: it takes the keyed server down."""
    auth = {"Authorization": f"Bearer {KEY}"}
    info = requests.get(keyed_server.url + "/get_server_info", headers=auth, timeout=30).json()
    children = keyed_server.children()
    assert {info["processes"]["scheduler"], info["processes"]["detokenizer"]} <= children
    result: dict = {}
    streaming = threading.Event()

    def long_request() -> None:
        # streamed, so the kill below lands once generation is under way: at most a few of
        # the 480 tokens are out by then (a non-streamed request could finish first)
        body = {"text": "Once", "stream": True,
                "sampling_params": {"max_new_tokens": 480, "ignore_eos": True}}
        events: list[bytes] = []
        try:
            with requests.post(keyed_server.url + "/generate", json=body, headers=auth,
                               stream=True, timeout=60) as r:
                result["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith(b"data:"):
                        events.append(line)
                        streaming.set()
        except requests.RequestException as exc:  # the server went away mid-request
            result["error"] = exc
        finally:
            result["events"] = events
            streaming.set()

    waiter = threading.Thread(target=long_request)
    waiter.start()
    assert streaming.wait(60), "the request never started streaming"
    os.kill(info["processes"]["scheduler"], signal.SIGKILL)
    waiter.join(60)
    assert not waiter.is_alive(), "a request hung after the scheduler died"
    assert result.get("status") in (None, 200), result
    assert len(result["events"]) < 100, "the request was not cut short by the dead scheduler"
    assert not any(b'"finish_reason": {"type": "length"' in e or b'"finish_reason":{"type":"length"'
                   in e for e in result["events"]), "it finished as if nothing had happened"
    assert keyed_server.proc.wait(60) == 1
    assert "the scheduler process died unexpectedly" in keyed_server.log()
    assert not wait_gone(children), "child processes outlived the server"


PARENT = textwrap.dedent("""
    import sys, time
    from radixflow.runtime.processes import Children
    children = Children(log_level="warning")
    conn = children.start("sleeper", "helpers.sleeper:run", 600.0)
    children.wait_ready("sleeper", conn)
    print(children.procs["sleeper"].pid, flush=True)
    time.sleep(600)
""")


def test_children_die_with_their_parent():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", ".."), os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        child = int(parent.stdout.readline())
        assert child in descendants(parent.pid)
        parent.kill()
        parent.wait()
        assert not wait_gone({child}, timeout=30), "the child outlived its parent"
    finally:
        kill_all(descendants(parent.pid))
        parent.kill()
