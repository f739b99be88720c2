"""/dashboard in a real headless browser (Debian's chromium through Playwright) against a real
server with --api-key: the page asks for the key, keeps it out of the URL, and after requests
that share a system prompt draws that prefix as one node with their hit count.

Outside CI the test skips when chromium is missing; under CI (CI=true) it fails instead, since
.ci/run installs it. The page runs under its own Content-Security-Policy (no eval): the test
waits with Playwright's `expect`, never with `wait_for_function`."""

from __future__ import annotations

import os
import shutil
import signal

import openai
import pytest
from helpers.live_server import LiveServer, kill_all

expect = pytest.importorskip("playwright.sync_api").expect

KEY = "dashboard-key-0123"
SYSTEM = ("You are the browser test's assistant. Keep every answer short, plain and polite, "
          "and never talk about trains.")
QUESTIONS = ("What is two plus two?", "Name a colour.", "Spell dog backwards.")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir, tmp_path_factory):
    srv = LiveServer("--model", str(tiny_model_dir), "--api-key", KEY, "--max-total-tokens",
                     "2048", "--served-model-name", "tiny",
                     log_path=tmp_path_factory.mktemp("dashboard") / "serve.log")
    yield srv
    children = srv.children()
    srv.stop()
    kill_all(children)


@pytest.fixture(scope="module")
def page():
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-background-networking", "--disable-dev-shm-usage"])
        context = browser.new_context(viewport={"width": 1280, "height": 1400})
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        # (the browser logs each refused poll as a failed load: those are expected)
        tab.on("console", lambda msg: msg.type == "error" and not msg.text.startswith(
            "Failed to load resource") and errors.append(msg.text))
        tab.errors = errors
        yield tab
        browser.close()


def test_the_page_asks_for_the_key_then_shows_the_shared_prefix(keyed_server, page):
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0,
                           timeout=120)
    for question in QUESTIONS:
        client.chat.completions.create(model="tiny", max_tokens=2, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])

    page.goto(keyed_server.url + "/dashboard")
    page.wait_for_selector("#key-panel:not([hidden])", timeout=TIMEOUT_MS)
    assert page.is_hidden("#main")
    page.fill("#key-input", "not-the-key")
    page.click("#key-submit")
    expect(page.locator("#key-error")).to_contain_text("refused", timeout=TIMEOUT_MS)
    page.fill("#key-input", KEY)
    page.click("#key-submit")
    page.wait_for_selector("#main:not([hidden])", timeout=TIMEOUT_MS)
    assert KEY not in page.url and page.evaluate("location.search") == ""

    shared = "g.node[data-text*=\"browser test's assistant\"]"
    page.wait_for_selector(shared, timeout=TIMEOUT_MS)
    nodes = page.query_selector_all(shared)
    assert len(nodes) == 1  # the system prompt is one node of the tree, not three
    node = nodes[0]
    assert int(node.get_attribute("data-hits")) == len(QUESTIONS) - 1
    assert int(node.get_attribute("data-tokens")) > 20
    label = node.query_selector("text").text_content()
    assert label.startswith(f"{node.get_attribute('data-tokens')}t · {len(QUESTIONS) - 1}h")
    kids = page.query_selector_all(f"g.node[data-parent=\"{node.get_attribute('data-node-id')}\"]")
    assert len(kids) == len(QUESTIONS)
    assert page.text_content("#status") == "live"
    assert page.query_selector(".replica[data-replica='0']") is not None
    assert not page.errors, page.errors


def test_the_playground_sends_a_chat_and_its_prefix_lands_in_the_tree(keyed_server, page):
    page.fill("#play-system", "Playground system prompt: list three fruits, comma separated.")
    page.fill("#play-user", "Go.")
    page.fill("#play-max", "3")
    page.click("#play-send")
    expect(page.locator("#play-status")).to_have_text("HTTP 200", timeout=TIMEOUT_MS)
    page.wait_for_selector("g.node[data-text*='Playground system prompt']", timeout=TIMEOUT_MS)
    page.select_option("#play-kind", "program")
    page.fill("#play-forks", "2")
    page.click("#play-send")
    expect(page.locator("#play-output")).to_contain_text('"b1"', timeout=TIMEOUT_MS)
    assert page.text_content("#play-status") == "HTTP 200"
    assert not page.errors, page.errors


def test_forgetting_the_key_locks_the_page_again(keyed_server, page):
    page.click("#forget-key")
    page.wait_for_selector("#key-panel:not([hidden])", timeout=TIMEOUT_MS)
    assert page.evaluate("sessionStorage.length") == 0


def test_the_page_survives_the_server_going_away(keyed_server, page):
    """Runs last: the page reports the error instead of throwing."""
    page.fill("#key-input", KEY)
    page.click("#key-submit")
    page.wait_for_selector("#main:not([hidden])", timeout=TIMEOUT_MS)
    kill_all(keyed_server.children())
    keyed_server.stop(signal.SIGKILL)
    expect(page.locator("#status")).to_have_attribute("data-state", "error",
                                                      timeout=TIMEOUT_MS)
    assert not page.errors, page.errors
