"""Take docs/dashboard.png: the /dashboard of a server on the default model after a small agent-
like workload (chats sharing a system prompt, a forked program), in headless chromium.

    python -m bench.dashboard_screenshot [--url http://127.0.0.1:30000] [--out docs/dashboard.png]

Without --url it starts `radixflow serve` (the default model) on a free port and stops it after.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import socket
import subprocess
import sys
import time

import openai
import requests

SYSTEM = ("You are a support assistant for a bicycle shop. Answer briefly and politely, and "
          "suggest a product from the catalogue when it helps.")
QUESTIONS = ["My chain keeps slipping, what should I check?", "Which helmet fits a child?",
             "How often should I pump my tyres?", "Do you repair e-bikes?",
             "What lock do you recommend for the city?"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.runtime.cli", "serve", "--port",
                             str(port)])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy in 600 s")


def workload(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id

    def ask(question: str) -> None:
        client.chat.completions.create(model=model, max_tokens=24, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        list(pool.map(ask, QUESTIONS))
    branch = lambda i: [{"type": "text", "text": f"\nIdea {i + 1}:"},  # noqa: E731
                        {"type": "gen", "name": f"idea{i}",
                         "sampling_params": {"max_new_tokens": 16}}]
    requests.post(url + "/program", timeout=300, json={"text": "", "nodes": [
        {"type": "text", "text": "Three names for a new bicycle shop, one per line."},
        {"type": "fork", "branches": [branch(i) for i in range(3)]},
        {"type": "join", "mode": "gather"}]}).raise_for_status()


def screenshot(url: str, out: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        page.goto(url + "/dashboard")
        expect(page.locator("#status")).to_have_text("live", timeout=30_000)
        time.sleep(2.5)  # a few polls: the charts fill in
        page.screenshot(path=out, full_page=True)
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running server (default: start one on the default model)")
    ap.add_argument("--out", default="docs/dashboard.png")
    args = ap.parse_args()
    proc, url = (None, args.url) if args.url else start_server()
    try:
        workload(url)
        screenshot(url, args.out)
        print(f"wrote {args.out}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
