"""Limits at the door (issue #24 items 4 and 5): body size (413), Content-Type (415), header
timeout (slowloris), connection cap and queue cap (503 + Retry-After), bounded per-stream
output, and 1,000 slow streams at once."""

from __future__ import annotations

import asyncio
import http.client
import json
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
from helpers.live_server import descendants, wait_idle

from radixflow.runtime.server.process import ServerProcess

MAX_BODY = 1024 * 1024
HEADER_TIMEOUT = 1
MAX_CONNECTIONS = 32
MAX_QUEUED = 6
STREAM_BUFFER = 2048
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def door(tiny_model_dir):
    rt = ServerProcess(str(tiny_model_dir), max_total_tokens=4096, max_running_requests=16,
                       served_model_name="tiny", log_level="warning", start_timeout=300,
                       max_request_bytes=MAX_BODY, http_header_timeout=HEADER_TIMEOUT,
                       max_connections=MAX_CONNECTIONS, max_queued_requests=MAX_QUEUED,
                       max_stream_buffer_bytes=STREAM_BUFFER, max_open_sessions=2)
    yield rt
    assert rt.shutdown() == 0


def gen_body(max_new_tokens: int, *, stream: bool = False, text: str = "hello") -> dict:
    return {"text": text, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                "ignore_eos": True}}


def host_port(server) -> tuple[str, int]:
    return server.args.host, server.args.port


def raw_head(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def raw_request(path: str, body: bytes) -> bytes:
    return raw_head(path, len(body)) + body


def read_response(s: socket.socket) -> bytes:
    """One whole response (head and its Content-Length body) from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def error_of(r: requests.Response) -> dict:
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    return err


class StreamBeside:
    """A /generate stream read in a thread, recording when each event arrived."""

    def __init__(self, server, max_new_tokens: int = 400):
        self.times: list[float] = []
        self.events: list[bytes] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(server, max_new_tokens),
                                       daemon=True)
        self.thread.start()

    def _run(self, server, max_new_tokens: int) -> None:
        try:
            with requests.post(server.url + "/generate", json=gen_body(max_new_tokens, stream=True),
                               stream=True, timeout=60) as r:
                assert r.status_code == 200, r.text
                for line in r.iter_lines():
                    if line.startswith(b"data:"):
                        self.times.append(time.monotonic())
                        self.events.append(line)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def wait_events(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.times) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.times) >= n, f"the stream beside sent {len(self.times)} events"

    def max_gap(self, since: float, until: float) -> float:
        ts = [t for t in self.times if since - 1 <= t <= until + 1]
        return max((b - a for a, b in zip(ts, ts[1:], strict=False)), default=0.0)


SEND_ALL = """
import socket, sys, time
port, size = int(sys.argv[1]), int(sys.argv[2])
body = b"{" + b" " * (size - 1)
head = (f"POST /generate HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
        f"Content-Length: {size}\\r\\n\\r\\n").encode()
t = time.monotonic()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(head + body)
data = b""
while not data.endswith(b"}}"):  # the end of the error's JSON
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
head, _, rest = data.partition(b"\\r\\n\\r\\n")
print(head.split()[1].decode(), time.monotonic() - t, rest.decode(errors="replace"))
"""


def test_huge_body_is_413_at_once_while_a_stream_runs(door):
    beside = StreamBeside(door)
    beside.wait_events(5)
    t0 = time.monotonic()
    # Content-Length says 50 MB: answered before the body is read (raw socket: time to answer).
    size = 50 * 1024 * 1024
    with socket.create_connection(host_port(door)) as s:
        s.sendall(raw_head("/generate", size))
        s.sendall(b"{" + b" " * (1024 * 1024))
        s.settimeout(5)
        answer = read_response(s)
        answered = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"--max-request-bytes" in answer
    # (a server that waited for the body would never answer: the read times out at 5 s)
    assert answered < 3.0, answered
    # And a client that sends all 50 MB before reading still gets the 413, quickly (from
    # another process, so that this one's GIL does not slow the stream's reader).
    done = subprocess.run([sys.executable, "-c", SEND_ALL, str(door.args.port), str(size)],
                          capture_output=True, text=True, timeout=60)
    status, whole, message = done.stdout.split(" ", 2)
    assert status == "413", done.stdout + done.stderr
    assert "--max-request-bytes" in message
    assert float(whole) < 5.0, whole
    t_end = time.monotonic()
    beside.wait_events(len(beside.times) + 3)  # still streaming after the attack
    assert beside.max_gap(t0, t_end) < 1.0, beside.max_gap(t0, t_end)
    beside.thread.join(60)
    assert beside.error is None, beside.error
    assert b'"length"' in beside.events[-2], beside.events[-2][-300:]  # finished, not aborted


def test_chunked_body_over_the_limit_is_413(door):
    def chunks(total: int):
        piece = b" " * 65536
        yield b"{"
        for _ in range(total // len(piece)):
            yield piece
        yield b"}"

    r = requests.post(door.url + "/generate", data=chunks(3 * MAX_BODY), headers=JSON, timeout=30)
    assert r.status_code == 413, r.text[:300]
    assert "--max-request-bytes" in error_of(r)["message"]
    # A chunked body under the limit is read whole and answered.
    small = json.dumps(gen_body(2)).encode()
    r = requests.post(door.url + "/generate", data=iter([small[:5], small[5:]]), headers=JSON,
                      timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert "text" in r.json()


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=xyz"])
def test_non_json_bodies_are_415(door, content_type):
    for path in ("/generate", "/v1/completions"):
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 2} if path.startswith("/v1") \
            else gen_body(2)
        r = requests.post(door.url + path, data=json.dumps(body),
                          headers={"Content-Type": content_type}, timeout=30)
        assert r.status_code == 415, (path, r.status_code, r.text[:300])
        assert "application/json" in error_of(r)["message"]


def test_a_get_with_a_huge_body_is_413(door):
    """GET /open_session reads a JSON body too: the limit is the body's, not the method's."""
    with socket.create_connection(host_port(door)) as s:
        s.sendall(raw_head("/open_session", 50 * 1024 * 1024).replace(b"POST", b"GET", 1))
        s.settimeout(5)
        answer = read_response(s)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_body_without_content_type_is_415(door):
    """A page's fetch() of a typeless Blob sends no Content-Type (and needs no preflight)."""
    r = requests.Request("POST", door.url + "/generate", data=json.dumps(gen_body(2))).prepare()
    r.headers.pop("Content-Type", None)
    with requests.Session() as session:
        answer = session.send(r, timeout=30)
    assert answer.status_code == 415, answer.text[:300]
    assert "application/json" in error_of(answer)["message"]


@pytest.mark.parametrize("method, path", [("get", "/flush_cache"), ("get", "/open_session"),
                                          ("post", "/generate"), ("get", "/get_server_info")])
def test_cross_site_requests_are_403(door, method, path):
    headers = {"Sec-Fetch-Site": "cross-site", "Content-Type": "application/json"}
    r = getattr(requests, method)(door.url + path, headers=headers, timeout=30,
                                  **({"data": json.dumps(gen_body(2))} if method == "post"
                                     else {}))
    assert r.status_code == 403, r.text[:300]
    assert "cross-site" in error_of(r)["message"]
    same = requests.get(door.url + "/get_server_info", headers={"Sec-Fetch-Site": "same-site"},
                        timeout=30)
    assert same.status_code == 200  # a page of the developer's own (localhost) site


def test_json_content_types_and_bodyless_posts_pass(door):
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        r = requests.post(door.url + "/generate", data=json.dumps(gen_body(2)),
                          headers={"Content-Type": content_type}, timeout=30)
        assert r.status_code == 200, (content_type, r.text[:300])
    # No body at all (whatever the Content-Type): not the door's business.
    wait_idle(door)
    r = requests.post(door.url + "/flush_cache", timeout=30)
    assert r.status_code == 200, r.text[:300]
    r = requests.post(door.url + "/flush_cache", headers={"Content-Type": "text/plain"},
                      timeout=30)
    assert r.status_code == 200, r.text[:300]


def test_slow_headers_are_cut_off(door):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 100
    t0 = time.monotonic()
    closed_after = None
    with socket.create_connection(host_port(door)) as s:
        for byte in request:
            try:
                s.send(bytes([byte]))
            except OSError:
                closed_after = time.monotonic() - t0
                break
            readable, _, _ = select.select([s], [], [], 0.3)
            if readable:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                assert data == b"", data[:200]  # no answer: the headers never completed
                closed_after = time.monotonic() - t0
                break
    assert closed_after is not None, "a slowloris connection stayed open"
    assert HEADER_TIMEOUT * 0.8 <= closed_after <= HEADER_TIMEOUT + 2.0, closed_after


def test_keep_alive_idle_is_not_the_header_timeout(door):
    conn = http.client.HTTPConnection(*host_port(door), timeout=10)
    try:
        conn.request("GET", "/health")
        assert conn.getresponse().read() is not None
        time.sleep(HEADER_TIMEOUT + 0.5)  # idle longer than the header timeout
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    finally:
        conn.close()


def test_connections_past_the_limit_get_503(door):
    time.sleep(HEADER_TIMEOUT + 0.5)  # earlier tests' idle connections are gone
    socks = []
    try:
        for _ in range(MAX_CONNECTIONS):
            socks.append(socket.create_connection(host_port(door)))
        time.sleep(0.1)
        extra = socket.create_connection(host_port(door))
        socks.append(extra)
        extra.settimeout(3)
        t0 = time.monotonic()
        answer = read_response(extra)
        assert time.monotonic() - t0 < 1.0
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b"retry-after:" in head.lower()
        assert "--max-connections" in json.loads(body)["error"]["message"]
    finally:
        for s in socks:
            s.close()
    # The slots free up: a new client is served.
    deadline = time.monotonic() + 10
    while True:
        try:
            if requests.get(door.url + "/health", timeout=5).status_code == 200:
                break
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, "connections were not freed"
        time.sleep(0.2)


def test_full_queue_is_503_with_retry_after(door):
    results: list[requests.Response] = []
    lock = threading.Lock()

    def one() -> None:
        r = requests.post(door.url + "/generate", json=gen_body(300), timeout=120)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=one) for _ in range(MAX_QUEUED * 2 + 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(r.status_code for r in results)
    assert set(codes) <= {200, 503}, codes
    assert 200 in codes and 503 in codes, codes
    for r in results:
        if r.status_code == 503:
            assert r.headers.get("Retry-After", "").isdigit(), r.headers
            assert "--max-queued-requests" in error_of(r)["message"]
    wait_idle(door)


def test_sessions_past_the_cap_are_429_until_one_closes(door):
    opened = [requests.post(door.url + "/open_session", json={"capacity_of_str_len": 64},
                            timeout=30) for _ in range(2)]
    assert [r.status_code for r in opened] == [200, 200], [r.text for r in opened]
    try:
        r = requests.post(door.url + "/open_session", json={"capacity_of_str_len": 64},
                          timeout=30)
        assert r.status_code == 429, r.text[:300]
        assert r.headers.get("Retry-After", "").isdigit()
        assert "--max-open-sessions" in error_of(r)["message"]
        requests.post(door.url + "/close_session", json={"session_id": opened.pop().json()},
                      timeout=30).raise_for_status()
        again = requests.post(door.url + "/open_session", json={"capacity_of_str_len": 64},
                              timeout=30)
        assert again.status_code == 200, again.text[:300]
        opened.append(again)
    finally:
        for r in opened:
            requests.post(door.url + "/close_session", json={"session_id": r.json()}, timeout=30)


def test_a_batch_bigger_than_the_queue_is_400(door):
    r = requests.post(door.url + "/generate", timeout=30,
                      json={**gen_body(2), "text": ["a"] * (MAX_QUEUED + 1)})
    assert r.status_code == 400, r.text[:300]  # never fits: retrying would not help
    assert "--max-queued-requests" in error_of(r)["message"]


def test_a_stream_nobody_reads_is_aborted_and_frees_its_kv(door):
    # Logprobs make each event big, so the socket buffers between us fill up soon.
    # Two samples (n=2) in one stream: the whole stream is aborted, both samples' KV freed.
    body = gen_body(3000, stream=True)
    body["sampling_params"]["n"] = 2
    body = json.dumps({**body, "return_logprob": True}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(host_port(door))
    try:
        s.sendall(raw_request("/generate", body))
        t0 = time.monotonic()
        # Not read: the output piles up past --max-stream-buffer-bytes and the request is
        # aborted (long before its 3,000 tokens), its KV freed.
        idle = wait_idle(door, timeout=60)
        assert idle["kv_used_tokens"] == 0
        aborted_after = time.monotonic() - t0
        s.settimeout(10)
        got = b""
        while b"[DONE]" not in got[-64:]:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    assert b"--max-stream-buffer-bytes" in got, (aborted_after, got[-500:])
    assert b'"completion_tokens":3000' not in got
    # The server still serves.
    r = requests.post(door.url + "/generate", json=gen_body(3), timeout=30)
    assert r.status_code == 200


def tree_rss(pid: int) -> int:
    total = 0
    for p in {pid, *descendants(pid)}:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


LOAD_STREAMS = 1000


def test_a_thousand_slow_streams_keep_memory_bounded(tiny_model_dir):
    rt = ServerProcess(str(tiny_model_dir), max_total_tokens=8192, max_running_requests=64,
                       served_model_name="tiny", log_level="warning", start_timeout=300,
                       max_connections=LOAD_STREAMS + 200,
                       max_queued_requests=LOAD_STREAMS + 200, max_stream_buffer_bytes=65536)
    try:
        _load(rt)
    finally:
        assert rt.shutdown() == 0


def _load(rt) -> None:
    pid = rt.proc.pid
    host, port = rt.args.host, rt.args.port
    baseline = tree_rss(pid)
    body = json.dumps(gen_body(8, stream=True, text="slow")).encode()
    request = raw_request("/generate", body)
    peak = baseline
    health_times: list[float] = []

    async def slow_client(i: int, stop: asyncio.Event) -> int:
        reader, writer = await asyncio.open_connection(host, port, limit=1024)
        got = 0
        try:
            writer.write(request)
            await writer.drain()
            while not stop.is_set():
                if i % 2:  # reads 64 bytes every 0.5 s
                    try:  # (a stream read to its end waits on the keep-alive connection)
                        chunk = await asyncio.wait_for(reader.read(64), 0.5)
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    got += len(chunk)
                await asyncio.sleep(0.5)
        finally:
            writer.close()
        return got

    async def main() -> None:
        nonlocal peak
        stop = asyncio.Event()
        clients = []
        for i in range(LOAD_STREAMS):
            clients.append(asyncio.create_task(slow_client(i, stop)))
            if i % 100 == 99:
                await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        t_end = time.monotonic() + 8
        # (at least two probes after the first, which can take most of the 8 s under load)
        while time.monotonic() < t_end or len(health_times) < 3:
            t0 = time.monotonic()
            r = await loop.run_in_executor(None, lambda: requests.get(rt.url + "/health",
                                                                      timeout=10))
            health_times.append(time.monotonic() - t0)
            assert r.status_code == 200
            peak = max(peak, tree_rss(pid))
            await asyncio.sleep(0.5)
        stop.set()
        done = await asyncio.gather(*clients, return_exceptions=True)
        errors = [d for d in done if isinstance(d, BaseException)]
        assert not errors, errors[:3]

    asyncio.run(main())
    # The first probe races the server admitting the burst of 1,000 requests (5-6 s under a full
    # CI run on 2 cores, ms alone); every probe after it is while the streams are only held.
    assert health_times[0] < 10.0, health_times
    assert max(health_times[1:]) < 5.0, health_times
    grown = peak - baseline
    assert grown < 1024 * 1024 * 1024, f"server tree RSS grew by {grown >> 20} MiB"
    info = wait_idle(rt, timeout=60)
    assert info["healthy"]
    r = requests.post(rt.url + "/generate", json=gen_body(3), timeout=30)
    assert r.status_code == 200
