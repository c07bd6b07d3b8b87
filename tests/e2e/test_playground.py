"""The playground page (GET /) in a real browser: headless Chromium from the distribution's
packages, driven by Selenium through the packaged chromedriver, against a real server on the
real model. Each state is photographed into tests/artifacts/ (not committed)."""

from __future__ import annotations

import json
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from helpers import MODEL, TASKS, assert_problem, checked_client
from lmsp.http.playground import CONTENT_SECURITY_POLICY
from lmsp.testing import RunningServer, start_server
from proxy import Proxy
from test_security import FULL, create_token

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
ANSWER_WAIT = 240  # seconds for an answer of the real model on a loaded machine

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)), reason="needs chromium and chromedriver"
    ),
]

# Records every length the newest answer's text had: each append of a delta is one mutation
# record (with the text before it), however the browser batches its observer callbacks.
WATCH_TEXT = """
window.__lengths = [];
new MutationObserver((records) => {
  const texts = document.querySelectorAll('#log .turn.assistant .text');
  if (!texts.length) return;
  const text = texts[texts.length - 1];
  for (const r of records)
    if (r.type === 'characterData' && text.contains(r.target)) window.__lengths.push(r.oldValue.length);
  window.__lengths.push(text.textContent.length);
}).observe(document.getElementById('log'),
  {subtree: true, childList: true, characterData: true, characterDataOldValue: true});
window.__states = [];
new MutationObserver(() => window.__states.push(document.getElementById('state').textContent))
  .observe(document.getElementById('state'), {subtree: true, childList: true, characterData: true});
"""


class Page:
    def __init__(self, driver: webdriver.Chrome, name: str) -> None:
        self.driver = driver
        self.name = name
        self.shots = 0

    def wait(self, condition: Any, timeout: float = ANSWER_WAIT, message: str = "") -> Any:
        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(lambda _: condition(), message)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def finds(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def shot(self, state: str) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        self.shots += 1
        self.driver.save_screenshot(str(ARTIFACTS / f"{self.name}-{self.shots}-{state}.png"))

    def open(self, url: str) -> None:
        self.driver.get(url + "/")
        self.wait(lambda: self.find("#send").is_enabled(), 60, "the page never got its models")
        self.js(WATCH_TEXT)

    def fill(self, css: str, value: str) -> None:
        field = self.find(css)
        field.clear()
        field.send_keys(value)

    def send(self, prompt: str) -> None:
        """Types the prompt and presses Enter, as a person would."""
        self.js("delete document.documentElement.dataset.status")
        self.find("#prompt").send_keys(prompt, Keys.ENTER)

    def status(self) -> str | None:
        return self.find("html").get_attribute("data-status")

    def wait_status(self) -> str:
        """How the answer ended; fails at once on a request the service refused."""
        self.wait(lambda: self.status() is not None or self.finds("#log .note.error"), message="the answer never ended")
        refused = self.finds("#log .note.error")
        assert self.status() is not None or not refused, refused[-1].text
        return self.status() or ""

    def attr(self, name: str) -> str:
        return self.find("html").get_attribute(f"data-{name}") or ""

    def answer_text(self) -> str:
        """The newest answer's text as streamed (textContent: also when shown pretty-printed)."""
        return self.finds("#log .turn.assistant .text")[-1].get_attribute("textContent") or ""

    def lengths(self) -> list[int]:
        return self.js("return window.__lengths")

    def errors(self) -> list[dict[str, Any]]:
        """Console errors, not counting failed loads the test made happen (cut connections)."""
        return [e for e in self.driver.get_log("browser") if e["level"] == "SEVERE" and e.get("source") != "network"]


@pytest.fixture()
def page(request: pytest.FixtureRequest) -> Iterator[Page]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,1100"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The packaged driver, named: Selenium Manager has nothing to find or download.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    page = Page(driver, request.node.name.removeprefix("test_")[:60])
    try:
        yield page
        assert page.errors() == []
        assert page.attr("csp-violations") == "0"
    finally:
        driver.quit()


def _stored_text(client: httpx.Client, response_id: str) -> tuple[dict[str, Any], str]:
    stored = client.get(f"/lmsp/v1/responses/{response_id}").json()
    message = next(i for i in stored["output"] if i["type"] == "message")
    return stored, "".join(p["text"] for p in message["content"])


def _stream_starts(proxy: Proxy) -> list[int]:
    """The id of the first event of each event stream the server sent through the proxy."""
    head = b"\r\ncontent-type: text/event-stream\r\n"
    starts = []
    for answer in proxy.answers:
        for piece in bytes(answer).split(head)[1:]:
            match = re.search(rb"(?m)^id: ([0-9]+)$", piece)
            if match:
                starts.append(int(match.group(1)))
    return starts


# The page's own reader, run again on a task that has ended: it replays every event, and when
# the stream closes after the final one its reconnect (Last-Event-ID: the final id) gets 204,
# which must close it for good (onEnded), not start another round.
FOLLOW_AGAIN = """
const [taskId, done] = [arguments[0], arguments[arguments.length - 1]];
import('/lmsp/playground/events.js').then(({followTask}) => {
  const seen = [];
  followTask(taskId, {
    onEvent: (id, name) => seen.push([id, name]), onOpen() {}, onReconnecting() {}, onEnded: () => done(seen),
  });
});
"""


def _follow_again(page: Page, proxy: Proxy) -> None:
    page.driver.set_script_timeout(60)
    seen = page.driver.execute_async_script(FOLLOW_AGAIN, page.attr("task-id"))
    assert [i for i, _ in seen] == list(range(1, len(seen) + 1)) and seen[-1][1] == f"response.{page.status()}"
    assert any(b"HTTP/1.1 204 " in a for a in proxy.answers)


# --- the page over plain HTTP ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/lmsp/"])
def test_the_page_is_served_with_a_strict_policy(server, path):  # covers: R10-4
    assert f"  playground {server.url}/\n" in server.log_path.read_text()  # `lmsp serve` says where
    with httpx.Client(base_url=server.url) as c:
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "<script>" not in r.text and " style=" not in r.text  # nothing inline the policy would block
        for asset, kind in [
            ("app.js", "text/javascript"),
            ("events.js", "text/javascript"),
            ("playground.css", "text/css"),
        ]:
            a = c.get(f"/lmsp/playground/{asset}")
            assert a.status_code == 200 and a.headers["content-type"].startswith(kind)
        assert_problem(c.get("/lmsp/playground/missing.js"), 404, "not_found")
        # Without tokens the page answers only loopback names, like every other route.
        assert_problem(c.get(path, headers={"host": "evil.example"}), 403, "host_not_allowed", "Host")


def test_same_origin_is_not_cross_origin(server):  # covers: R10-4
    own = server.url
    payload = {"model": MODEL, "input": "x"}  # invalid: the point is who gets past the origin check
    with httpx.Client(base_url=server.url) as c:
        same = c.post(TASKS, json=payload, headers={"origin": own})
        assert_problem(same, 400, "invalid_request", "input")
        assert "access-control-allow-origin" not in same.headers
        other = c.post(TASKS, json=payload, headers={"origin": "http://127.0.0.1:1"})
        assert_problem(other, 403, "origin_not_allowed", "Origin")


# --- the page in a browser -------------------------------------------------------------------


def test_a_prompt_streams_and_ends_as_stored(server, page, client):  # covers: R6.3-4, R6.1-6, R7-3
    page.open(server.url)
    badges = [b.text for b in page.finds("#capabilities li")]
    assert {"streaming", "tools", "structured_output", "conversations"} <= set(badges)
    page.shot("loaded")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "60")
    page.send("Describe the sea in three sentences.")
    status = page.wait_status()
    page.shot("answered")
    assert status in ("completed", "incomplete")
    lengths = page.lengths()
    assert lengths == sorted(lengths) and len(set(lengths)) > 2, lengths  # it grew, delta by delta
    stored, text = _stored_text(client, page.attr("response-id"))
    assert page.answer_text() == text and text
    assert stored["status"] == status
    assert page.find("#ttft").text.endswith(" ms") and float(page.find("#rate").text) > 0
    # The conversation goes on from the stored answer.
    first = page.attr("response-id")
    page.send("Say it again in one sentence.")
    page.wait_status()
    second, _ = _stored_text(client, page.attr("response-id"))
    assert page.attr("response-id") != first and second["usage"]["input_tokens"] > stored["usage"]["input_tokens"]
    page.shot("conversation")


def test_a_json_schema_answer_validates(server, page, client):  # covers: R6.5-6
    page.open(server.url)
    page.find("#mode-json").click()
    schema = json.loads(page.find("#schema").get_attribute("value") or "")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "120")
    page.send("Invent a person.")
    assert page.wait_status() == "completed"
    page.shot("json")
    shown = json.loads(page.finds("#log .turn.assistant pre.json")[-1].text)
    jsonschema.validate(shown, schema)
    assert "valid" in page.finds("#log .verdict")[-1].get_attribute("class")
    _, text = _stored_text(client, page.attr("response-id"))
    assert json.loads(text) == shown and page.answer_text() == text


def test_a_tool_round_trip(server, page, client):  # covers: R6.5-1, R6.5-4
    page.open(server.url)
    page.find("#mode-tools").click()
    tool = json.loads(page.find("#tool").get_attribute("value") or "")
    Select(page.find("#tool-choice")).select_by_value("required")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "60")
    page.send("What is the weather like in Paris?")
    assert page.wait_status() == "completed"
    card = page.finds("#log .turn.call")[-1]
    assert card.find_element(By.CSS_SELECTOR, ".call-name").text == tool["name"]
    jsonschema.validate(json.loads(card.find_element(By.CSS_SELECTOR, ".call-arguments").text), tool["parameters"])
    page.shot("call")
    result = card.find_element(By.CSS_SELECTOR, "textarea")
    result.send_keys('{"temperature_c": 18, "sky": "clear"}')
    page.js("delete document.documentElement.dataset.status")
    send = card.find_element(By.CSS_SELECTOR, "button")
    page.js("arguments[0].scrollIntoView({block: 'center'})", send)
    send.click()
    assert page.wait_status() in ("completed", "incomplete")
    page.shot("result")
    stored, text = _stored_text(client, page.attr("response-id"))
    assert stored["output"][0]["type"] == "message" and page.answer_text() == text


def test_the_stop_button_cancels_the_task(server, page, client):  # covers: R7-4
    page.open(server.url)
    page.fill("#max-tokens", "2000")
    page.send("Write a very long story about a dragon and a lighthouse, with many chapters.")
    page.wait(lambda: page.lengths() and page.lengths()[-1] > 0, message="no text came")
    page.find("#stop").click()
    assert page.wait_status() == "cancelled"
    page.shot("cancelled")
    task = client.get(f"{TASKS}/{page.attr('task-id')}").json()
    assert task["status"] == "cancelled" and task["response"]["status"] == "cancelled"
    assert page.find("#send").is_enabled()


def _cut_mid_answer(page: Page, proxy: Proxy) -> str:
    """Waits for text, hangs up every connection; returns the text shown at the cut."""
    page.wait(lambda: page.lengths() and page.lengths()[-1] > 0, message="no text came")
    proxy.hang_up()
    shown = page.answer_text()
    page.wait(lambda: any("reconnecting" in s for s in page.js("return window.__states")), 30, "the page never noticed")
    page.shot("reconnecting")
    return shown


def test_a_cut_connection_resumes_with_nothing_lost_or_repeated(
    server, page, client
):  # covers: R6.4-1, R6.4-2, R7-3, R7-6
    with Proxy(server.port, lambda n: None) as proxy:
        page.open(proxy.url)
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "300")
        page.send("Write a long story about a fox who learns to sail.")
        at_cut = _cut_mid_answer(page, proxy)
        status = page.wait_status()
        page.shot("resumed")
        starts = _stream_starts(proxy)
        _follow_again(page, proxy)
    assert status in ("completed", "incomplete")
    _, text = _stored_text(client, page.attr("response-id"))
    assert page.answer_text() == text and text.startswith(at_cut) and len(at_cut) < len(text)
    # The browser came back and asked for what followed the last event it had: not from 1.
    assert starts[0] == 1 and any(start > 1 for start in starts), starts
    # The page checks each id against the one before it (console errors on a repeat or a gap).


def test_with_a_token_the_page_asks_for_one_and_resumes_with_it(tmp_path, page):  # covers: R10-1, R6.4-2, R7-6
    data = tmp_path / "data"
    token = create_token(data, FULL, "browser")
    srv = start_server(tmp_path, "--data-dir", str(data))
    try:
        with Proxy(srv.port, lambda n: None) as proxy:
            page.driver.get(proxy.url + "/")
            page.wait(lambda: page.find("#token-form").is_displayed(), 60, "no token asked for")
            page.shot("token")
            page.find("#token").send_keys("lmsp_wrong", Keys.ENTER)
            page.wait(lambda: "unknown" in page.find("#token-error").text, 30, "a wrong token was taken")
            page.find("#token").send_keys(token, Keys.ENTER)
            page.wait(lambda: page.find("#send").is_enabled(), 60, "the token was not taken")
            assert page.js("return [sessionStorage.getItem('lmsp.token'), localStorage.length, document.cookie]") == [
                token,
                0,
                "",
            ]
            page.js(WATCH_TEXT)
            page.fill("#temperature", "0")
            page.fill("#max-tokens", "300")
            page.send("Write a long story about a fox who learns to sail.")
            at_cut = _cut_mid_answer(page, proxy)
            status = page.wait_status()
            starts = _stream_starts(proxy)
            _follow_again(page, proxy)
        with checked_client(srv.url) as c:
            c.headers["authorization"] = f"Bearer {token}"
            _, text = _stored_text(c, page.attr("response-id"))
    finally:
        srv.stop()
    assert status in ("completed", "incomplete")
    assert page.answer_text() == text and text.startswith(at_cut) and len(at_cut) < len(text)
    assert starts[0] == 1 and any(start > 1 for start in starts), starts


@pytest.mark.parametrize(
    ("stop", "noticed"),
    [
        # Killed: the connection drops, EventSource reconnects until the new process answers 410
        # (the events lived in the old one); the page then reads the task.
        (signal.SIGKILL, "reconnecting"),
        # Stopped: the stream ends with an `error` event and the task ends failed
        # (service_unavailable) before the process goes; the page reads the task.
        (signal.SIGTERM, "Reading the task"),
    ],
    ids=["kill", "term"],
)
def test_a_service_restart_mid_answer_ends_the_answer_failed(tmp_path, page, stop, noticed):  # covers: R7-5
    data = tmp_path / "data"
    first = start_server(tmp_path, "--data-dir", str(data))
    second: RunningServer | None = None
    try:
        with Proxy(first.port, lambda n: None) as proxy:
            page.open(proxy.url)
            page.fill("#max-tokens", "2000")
            page.send("Write a very long story about a dragon and a lighthouse, with many chapters.")
            page.wait(lambda: page.lengths() and page.lengths()[-1] > 0, message="no text came")
            first.proc.send_signal(stop)
            first.proc.wait(timeout=60)
            page.wait(
                lambda: any(noticed in s for s in page.js("return window.__states")), 30, "the page never noticed"
            )
            page.shot("restarting")
            second = start_server(tmp_path, "--data-dir", str(data))
            proxy.upstream_port = second.port
            assert page.wait_status() == "failed"
            page.shot("after-restart")
            expired = any(b"HTTP/1.1 410 " in a for a in proxy.answers)
            notes = [n.text for n in page.finds("#log .turn.note.error")]
        with checked_client(second.url) as c:
            task = c.get(f"{TASKS}/{page.attr('task-id')}").json()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert task["response"] is not None and notes  # final across the restart, and the page says so
    if stop == signal.SIGKILL:
        assert expired and task["status"] == "failed" and task["response"]["error"]["code"] in notes[-1]
    else:
        # What the task said while the service stopped; what the restarted service's record
        # says afterwards is the service's business, not the page's.
        assert not expired and "service_unavailable" in notes[-1]
    # EventSource reports the 410 that ended its reconnecting as an error: that one is expected.
    unexpected = [e for e in page.errors() if "410" not in e["message"]]
    assert unexpected == []


def test_the_policy_blocks_inline_script_and_the_page_counts_it(server, page):  # covers: R10-4
    page.open(server.url)
    page.js("const s = document.createElement('script'); s.textContent = 'window.__ran = 1'; document.body.append(s)")
    page.wait(lambda: page.attr("csp-violations") == "1", 10, "no violation counted")
    assert page.js("return window.__ran") is None
    assert any("Content Security Policy" in e["message"] for e in page.driver.get_log("browser"))
    page.js("document.documentElement.dataset.cspViolations = '0'")  # the one this test made


def test_a_narrow_screen_and_labels(server, page):
    page.driver.set_window_size(360, 780)
    page.open(server.url)
    page.shot("narrow")
    assert page.js("return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    unlabelled = page.js(
        "return [...document.querySelectorAll('input, select, textarea, button')]"
        ".filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())"
        ".map(e => e.id || e.outerHTML)"
    )
    assert unlabelled == []
    assert page.find("#log").get_attribute("aria-live") == "polite"
    # Keyboard only: Tab reaches the prompt, Enter sends.
    page.find("#prompt").send_keys("Hi", Keys.ENTER)
    assert page.wait_status() in ("completed", "incomplete")
    page.shot("narrow-answered")
