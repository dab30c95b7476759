"""The playground page at /ui.

The routes are checked through the ASGI app. The page itself runs in a real browser: Debian's chromium,
headless, driven by Playwright for Python, against a real `toolscout serve` subprocess that requires a
token for reads; everything the page shows is compared with what the public API answers for the same
request. The browser tests are skipped, with the reason, when /usr/bin/chromium or Playwright is missing
(`scripts/setup.sh` installs both where it can).
"""

import json
import os
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import sample_tools
from starlette.testclient import TestClient

from toolscout import ToolScout
from toolscout.serve import ToolService, create_app
from toolscout.serve.auth import AuthConfig
from toolscout.tool import Tool

pytestmark = pytest.mark.slow  # starts a server and a browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
TOKEN = "playground-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
HOSTILE = 'Write a note. <img src=x onerror="document.title=\'pwned\'"><b>bold</b> & <script>alert(1)</script>'
WAIT_MS = 20_000


LONG_NAME = "MixerBox_Translate_AI_language_tutor_and_dictionary_for_every_language_pair_in_the_world"


def catalog() -> list[Tool]:
    """conftest's sample tools, one with no namespace whose description is hostile HTML, and one whose name is
    long and unbroken (as some real catalogs' are)."""
    return [*sample_tools(), Tool("add_note", "add_note", HOSTILE, {"type": "object", "properties": {}}),
            Tool(f"translation.{LONG_NAME}", LONG_NAME, "Translate text from one language into another language.",
                 {"type": "object", "properties": {}}, namespace="translation")]


# ------------------------------------------------------------------------------------- the routes

@pytest.fixture
def app_client(tmp_path):
    folder = tmp_path / "idx"
    ToolScout.from_tools(catalog(), retriever="bm25").save(folder)
    service = ToolService.open(folder, fsync=False)
    with TestClient(create_app(service, AuthConfig.build(TOKEN, None, require_read_token=True))) as client:
        yield client


def test_the_page_and_its_files_need_no_token_and_stay_out_of_the_api_schema(app_client):
    page = app_client.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'src="ui/app.js"' in page.text and 'href="ui/style.css"' in page.text
    assert app_client.get("/ui/app.js").headers["content-type"] == "text/javascript; charset=utf-8"
    assert app_client.get("/ui/style.css").headers["content-type"] == "text/css; charset=utf-8"
    assert app_client.head("/ui").status_code == 200
    missing = app_client.get("/ui/secrets.txt")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"
    assert app_client.get("/namespaces").status_code == 401  # the API itself still wants the token
    assert not [p for p in app_client.get("/openapi.json", headers=AUTH).json()["paths"] if p.startswith("/ui")]


def test_the_script_never_parses_data_as_html():
    script = (Path(__file__).resolve().parents[1] / "src/toolscout/serve/ui/app.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script


# ------------------------------------------------------------------------------------- the browser

@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright for Python: "
                                                                "pip install -e '.[test]' (scripts/setup.sh)")
    if not CHROMIUM.exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}: apt-get install chromium (scripts/setup.sh does, as root)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.script_errors = []  # uncaught exceptions in the page's script
    page.on("pageerror", lambda error: page.script_errors.append(str(error)))
    yield page
    context.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_healthy(proc: subprocess.Popen, url: str) -> None:
    for _ in range(600):  # up to a minute: the server imports its web stack and loads the index
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        try:
            proc.wait(timeout=0.1)  # the pause between tries, and a server that exits ends the wait
        except subprocess.TimeoutExpired:
            continue
        raise AssertionError(f"toolscout serve exited: {proc.stderr.read().decode()[-2000:]}")
    raise AssertionError("toolscout serve did not answer /health within a minute")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real `toolscout serve` on a free loopback port: reads need the token, files.read is always
    included, and mail.send has learned from some feedback. Yields an httpx client (with the token)."""
    folder = tmp_path_factory.mktemp("ui") / "idx"
    ToolScout.from_tools(catalog(), retriever="bm25").save(folder)
    with served(folder, "--token", TOKEN, "--require-read-token", "--always-include", "files.read",
                headers=AUTH) as client:
        events = [{"query": "email my manager the report", "tool_ids": ["mail.send"], "source": "agent-a"},
                  {"query": "mail the team about lunch", "tool_ids": ["mail.send"], "source": "agent-b"},
                  {"query": "send the invoice by email", "tool_ids": ["mail.send"], "source": "agent-b"}]
        assert client.post("/feedback", json={"events": events}).status_code == 200
        yield client


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory, encoder):
    """A real `toolscout serve` (no token) over the default pipeline (calibrated: its hits have probabilities)
    with an LLM reranker whose model (tests/fakellm.py) fails on tasks about flights and judges the others
    (a reranked ranking has no probabilities). Yields (an httpx client, the fake LLM's URL)."""
    from fakellm import FakeLLM, Reply, message_text

    from toolscout.llm import LLMSettings
    from toolscout.rerank.llm import LLMReranker

    top = [{"token": "true", "logprob": -0.1}, {"token": "false", "logprob": -2.4}]
    judgement = Reply("true", logprobs=[{"token": "true", "logprob": -0.1, "top_logprobs": top}])
    def respond(request):  # the task comes before the tool's documentation in the prompt
        return Reply(status=500) if "flight" in message_text(request).split("Tool documentation:")[0] else judgement

    with FakeLLM(responder=respond) as llm:
        reranker = LLMReranker(LLMSettings(base_url=llm.url, model="m", timeout=5.0, max_retries=0))
        folder = tmp_path_factory.mktemp("ui-rerank") / "idx"
        ToolScout.from_tools(catalog(), encoder=encoder, reranker=reranker).save(folder)
        with served(folder) as client:
            yield client, llm.url


@contextmanager
def served(folder: Path, *options: str, headers: dict | None = None):
    """A real `toolscout serve` of `folder` on a free loopback port, stopped after: an httpx client of it
    (sending `headers`)."""
    url = f"http://127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "toolscout.serve", str(folder), "--port", url.rsplit(":", 1)[1], "--no-fsync",
               *options]
    proc = subprocess.Popen(command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        _wait_until_healthy(proc, url)
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            yield client
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def url_of(server, path: str) -> str:
    return str(server.base_url).rstrip("/") + path


def open_page(page, server, token: str | None = TOKEN) -> None:
    page.goto(url_of(server, "/ui"))
    if token is not None:
        enter_token(page, token)
        page.get_by_test_id("namespace").first.wait_for()


def enter_token(page, token: str) -> None:
    page.fill("#token", token)
    page.click("#token-form button[type=submit]")


def error_banner(page):
    return page.get_by_test_id("error")


# --------------------------------------------------------------------------- tokens and errors

def test_the_page_shows_the_apis_401_until_a_token_is_given(page, server):
    no_token = httpx.get(url_of(server, "/namespaces")).json()["error"]["message"]
    open_page(page, server, token=None)
    error_banner(page).wait_for(state="visible")
    assert error_banner(page).inner_text() == f"401 unauthorized: {no_token}"
    assert page.get_by_test_id("namespace").count() == 0

    enter_token(page, "not-the-token")
    page.get_by_text("invalid bearer token").wait_for()
    assert error_banner(page).inner_text() == "401 unauthorized: invalid bearer token"

    enter_token(page, TOKEN)
    page.get_by_test_id("namespace").first.wait_for()
    assert not error_banner(page).is_visible()
    namespaces = server.get("/namespaces").json()["namespaces"]
    assert page.get_by_test_id("namespace").count() == len(namespaces)
    assert page.evaluate("sessionStorage.getItem('toolscout.playground.token')") == TOKEN
    assert page.get_by_test_id("token-state").inner_text() == "token in use (this tab only)"

    page.click("#token-forget")
    error_banner(page).wait_for(state="visible")
    assert no_token in error_banner(page).inner_text() and page.get_by_test_id("namespace").count() == 0
    assert page.script_errors == []


# --------------------------------------------------------------------------- search

def api_rows(server, body: dict) -> list[tuple]:
    """(id, match, matched words, score) of each hit the API returns for `body`, as the page asks it."""
    hits = server.post("/search", json={**body, "explain": True}).json()["results"][0]["hits"]
    return [(h["id"], h["match"], h["matched"], h["score"]) for h in hits]


def shown_rows(page) -> list[tuple]:
    """The same for the hits the page shows."""
    return [(hit.get_attribute("data-id"), hit.get_by_test_id("match").inner_text(),
             hit.locator("[data-testid=matched] .word").all_inner_texts(),
             float(hit.get_by_test_id("score").get_attribute("title")))
            for hit in page.get_by_test_id("hit").all()]


def search(page, task: str, k: int, namespace: str | None = None) -> None:
    """Search from the page's form and wait for the answer (the list is aria-busy until it is shown)."""
    page.fill("#task", task)
    page.fill("#k", str(k))
    page.select_option("#namespace", "all" if namespace is None else f"ns:{namespace}")
    page.click("#search-button")  # its handler marks the list busy before click() returns
    page.locator("#hits[aria-busy=false]").wait_for(state="attached")


def test_ranked_tools_match_the_api_with_kinds_and_matched_words(page, server):
    open_page(page, server)
    cases = [("email the passenger about the booked flight", 3, None),  # retrieval + always
             ("send_email", 2, None),  # a name match first
             ("book a flight and a hotel room", 5, "travel"),  # the namespace filter (no files: no always)
             ("write a note", 3, "")]  # "(no namespace)": the tools that have none
    kinds = set()
    for task, k, namespace in cases:
        body = {"query": task, "k": k, **({"namespaces": [namespace]} if namespace is not None else {})}
        expected = api_rows(server, body)
        assert expected, task
        search(page, task, k, namespace)
        assert not error_banner(page).is_visible() and shown_rows(page) == expected, task
        kinds |= {row[1] for row in expected}
        assert namespace is None or {server.get(f"/tools/{row[0]}").json().get("namespace", "")
                                     for row in expected} == {namespace}
    assert kinds == {"retrieval", "name", "always"}
    assert any(row[2] for row in api_rows(server, {"query": cases[0][0], "k": 3}))  # words did match
    assert page.script_errors == []


def test_a_task_the_llm_reranker_could_not_rank_shows_a_note_over_its_hits(page, rerank_server):
    """The page showed the first stage's hits of a task the LLM reranker failed on as if it had ranked them
    (trial8 #5): a note above them says so, with the API's `degraded` reason; a task it ranked shows none."""
    server, _llm_url = rerank_server
    page.goto(url_of(server, "/ui"))
    search(page, "book a flight", 3)
    answer = server.post("/search", json={"query": "book a flight", "k": 3}).json()["results"][0]
    note = page.get_by_test_id("degraded")
    assert note.is_visible()
    assert answer["degraded"]["reason"] == "the LLM answered HTTP 500"
    assert note.inner_text() == ("The LLM reranker could not rank this task, so these are the first stage's results: "
                                 + answer["degraded"]["reason"])
    shown = [hit.get_attribute("data-id") for hit in page.get_by_test_id("hit").all()]
    assert shown == [h["id"] for h in answer["hits"]]
    search(page, "send an email", 3)
    assert not note.is_visible()
    assert "degraded" not in server.post("/search", json={"query": "send an email"}).json()["results"][0]
    assert page.script_errors == []


def test_each_hit_shows_its_probability_when_the_answer_has_one(page, rerank_server):
    """The page showed only the score, though the API gives a calibrated probability (trial8 #14): each hit
    shows it (its exact value and what it means in the title), with a legend; an answer without
    probabilities (the LLM reranker's ranking) shows neither."""
    server, _llm_url = rerank_server
    page.goto(url_of(server, "/ui"))
    search(page, "book a flight", 3)  # the reranker failed: the first stage's hits, with their probabilities
    hits = server.post("/search", json={"query": "book a flight", "k": 3}).json()["results"][0]["hits"]
    assert all(h.get("probability") is not None for h in hits)
    shown = page.get_by_test_id("probability")
    assert shown.all_inner_texts() == [f"p {h['probability']:.2f}" for h in hits]
    assert [float(t.split(":")[0]) for t in (s.get_attribute("title") for s in shown.all())] == \
        [h["probability"] for h in hits]
    legend = page.get_by_test_id("probability-legend")
    assert legend.is_visible() and "calibrated probability that the tool is one the task needs" in legend.inner_text()
    search(page, "send an email", 3)  # ranked by the reranker: no probabilities
    ranked = server.post("/search", json={"query": "send an email", "k": 3}).json()["results"][0]["hits"]
    assert "probability" not in ranked[0]
    assert shown.count() == 0 and not legend.is_visible()
    assert page.script_errors == []


# --------------------------------------------------------------------------- keyboard, narrow windows, failures

def test_enter_searches_and_shift_enter_starts_a_new_line(page, server):
    """Enter in the task box added a newline and searched nothing (trial8 #14)."""
    open_page(page, server)
    page.fill("#task", "send an email")
    page.fill("#k", "2")
    page.locator("#task").press("Shift+Enter")
    assert page.input_value("#task") == "send an email\n" and page.get_by_test_id("hit").count() == 0
    page.locator("#task").press("Enter")
    page.get_by_test_id("hit").first.wait_for()
    assert page.input_value("#task") == "send an email\n"  # Enter added nothing
    assert shown_rows(page) == api_rows(server, {"query": "send an email", "k": 2})
    assert page.script_errors == []


def test_a_390_pixel_window_does_not_scroll_sideways(browser, server):
    """At 390 px the page was 473 px wide (the header did not wrap), long tool names overflowed their list and
    the learning table its panel (trial8 #14): now nothing is wider than the window."""
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        open_page(page, server)
        page.get_by_test_id("learning-row").first.wait_for()
        search(page, "translate text into another language", 3)
        assert page.locator(f"[data-testid=hit][data-id='translation.{LONG_NAME}']").count() == 1
        page.locator("[data-testid=namespace] button[data-namespace=translation]").click()
        page.locator("[data-testid=catalog-tool]").first.wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # every panel holds what it shows (the learning table scrolls inside its own box)
        assert page.evaluate("""[...document.querySelectorAll('main > *')].every(
            (panel) => panel.getBoundingClientRect().right <= 390 && panel.scrollWidth <= panel.clientWidth)""")
    finally:
        context.close()


def test_a_refused_or_failed_search_clears_the_last_results_and_an_unreachable_server_is_said(page, server):
    """A k the form refuses (0, 500) left the previous task's results under the new task; and with the server
    unreachable the status line still showed its last tool count (trial8 #14)."""
    open_page(page, server)
    status = page.get_by_test_id("server-status")
    health = server.get("/health").json()
    assert status.inner_text().startswith(f"{health['tools']} tools · version {health['version']}")
    search(page, "send an email", 2)
    assert page.get_by_test_id("hit").count() == len(api_rows(server, {"query": "send an email", "k": 2})) > 0
    page.fill("#k", "500")
    page.locator("#task").press("Enter")  # the browser refuses the form: no request
    page.get_by_test_id("search-summary").filter(has_text="Not searched: k:").wait_for()
    assert page.get_by_test_id("hit").count() == 0

    search(page, "send an email", 2)
    page.route("**/search", lambda route: route.abort())  # the server cannot be reached
    page.click("#search-button")
    error_banner(page).filter(has_text="network_error").wait_for()
    assert page.get_by_test_id("hit").count() == 0
    assert status.inner_text().startswith("server unreachable: could not reach the toolscout server")
    page.unroute("**/search")
    search(page, "send an email", 2)
    status.filter(has_text=f"{health['tools']} tools · version").wait_for()  # reachable again: said again
    assert page.get_by_test_id("hit").count() > 0 and page.script_errors == []


# --------------------------------------------------------------------------- one tool, the catalog

def test_schema_feedback_and_namespace_browsing(page, server):
    open_page(page, server)
    search(page, "send an email to my team", 3)
    page.locator("[data-testid=hit][data-id='mail.send'] [data-testid=open-tool]").click()
    page.get_by_test_id("detail-name").filter(has_text="send_email").wait_for()
    record = server.get("/tools/mail.send").json()
    assert json.loads(page.get_by_test_id("schema").inner_text()) == record["parameters"]
    shown = {key: int(page.get_by_test_id(f"feedback-{key}").inner_text()) for key in record["feedback"]}
    assert shown == record["feedback"] and record["feedback"]["learned"] > 0

    page.locator("[data-testid=namespace] button[data-namespace=travel]").click()
    travel = server.get("/tools", params={"namespace": "travel"}).json()
    page.get_by_test_id("catalog-summary").filter(has_text=f"travel: {travel['total']} of").wait_for()
    assert [t.get_attribute("data-id") for t in page.get_by_test_id("catalog-tool").all()] == \
        [t["id"] for t in travel["tools"]]
    page.locator("[data-testid=catalog-tool][data-id='hotels.book'] [data-testid=open-tool]").click()
    page.get_by_test_id("detail-name").filter(has_text="book-hotel-room").wait_for()
    assert json.loads(page.get_by_test_id("schema").inner_text()) == \
        server.get("/tools/hotels.book").json()["parameters"]
    assert page.script_errors == []


def test_the_learning_panel_shows_what_the_server_measured_of_its_learning(page, server):
    open_page(page, server)
    report = server.get("/learning").json()
    page.get_by_test_id("learning-row").first.wait_for()
    rows = {row.get_attribute("data-namespace"): (row.get_by_test_id("learning-events").inner_text(),
                                                  row.get_by_test_id("learning-mrr").inner_text())
            for row in page.get_by_test_id("learning-row").all()}

    def mrrs(f):
        return f"{f['served']['mrr']:.3f} / {f['untaught']['mrr']:.3f}" if f["events"] else "-"
    # first-seen requests apart from repeats (trial 10: repeats hid harm)
    want = {ns: (f"{f['first_seen']['events']} + {f['repeats']['events']}", mrrs(f["first_seen"]))
            for ns, f in report["measured"]["namespaces"].items()}
    assert rows == want and rows["mail"][0] == "3 + 0"  # the three events the fixture posted, scored
    assert f"{report['requests']} requests learned" in page.get_by_test_id("learning-summary").inner_text()
    # the whole table in its panel at this width (its last column was cut off: trial8 #14)
    assert page.evaluate("(box => box.scrollWidth <= box.clientWidth)(document.querySelector('.table-scroll'))")
    assert page.script_errors == []


def test_a_hit_can_be_reported_as_having_served_the_task(page, server):
    """Feedback could be read per tool but not given from the page (trial8 #14): "it served the task" posts
    the task and the tool to POST /feedback with the page's token; the index learns it at once (the tool's
    feedback counts, and the learning panel, say so), and a second report is said to count once."""
    open_page(page, server)
    task, tool = "weather forecast for Lisbon this week", "weather.get_forecast"
    before = server.get(f"/tools/{tool}").json()["feedback"]["learned"]
    search(page, task, 3)
    page.locator(f"[data-testid=hit][data-id='{tool}'] [data-testid=served]").click()
    said = page.locator(f"[data-testid=hit][data-id='{tool}'] [data-testid=served-said]")
    said.wait_for()
    assert said.inner_text() == "reported: learned"
    assert server.get(f"/tools/{tool}").json()["feedback"]["learned"] == before + 1
    page.locator("[data-testid=learning-row][data-namespace=weather]").wait_for()  # the panel was reloaded
    search(page, task, 3)
    page.locator(f"[data-testid=hit][data-id='{tool}'] [data-testid=served]").click()
    said.filter(has_text="reported before: counted once").wait_for()
    assert server.get(f"/tools/{tool}").json()["feedback"]["learned"] == before + 1
    assert page.script_errors == []


def test_untrusted_tool_text_is_shown_as_text(page, server):
    open_page(page, server)
    title = page.title()
    page.locator("[data-testid=namespace] button[data-namespace='']").click()
    item = page.locator("[data-testid=catalog-tool][data-id=add_note]")
    item.wait_for()
    assert item.locator(".description").inner_text() == HOSTILE
    item.get_by_test_id("open-tool").click()
    page.get_by_test_id("detail-name").filter(has_text="add_note").wait_for()
    assert page.locator("#detail .description").inner_text() == HOSTILE
    assert page.locator("main img, main b, main script").count() == 0 and page.title() == title
    assert page.script_errors == []


# --------------------------------------------------------------------------- /docs without the network

def test_the_api_docs_page_says_where_the_api_is_described_when_swagger_ui_cannot_load(page, server):
    """/docs loads Swagger UI from a CDN and was blank offline: it says that /openapi.json and the playground
    work without the network, until Swagger UI has loaded (a stand-in for the CDN's bundle here)."""
    page.route("https://cdn.jsdelivr.net/**", lambda route: route.abort())  # offline
    page.goto(url_of(server, "/docs"))
    note = page.locator("#offline-note")
    assert "cdn.jsdelivr.net" in note.inner_text() and note.is_visible()
    page.locator("#offline-note a", has_text="/openapi.json").click()
    page.wait_for_url("**/openapi.json")
    assert json.loads(page.locator("body").inner_text())["info"]["title"] == "toolscout"

    online = page.context.new_page()
    bundle = "window.SwaggerUIBundle = function () {}; SwaggerUIBundle.presets = {apis: {}};"
    online.route("https://cdn.jsdelivr.net/**", lambda route: route.fulfill(
        body=bundle if route.request.url.endswith(".js") else "", content_type="text/javascript"))
    online.goto(url_of(server, "/docs"))
    assert online.locator("#swagger-ui").count() == 1 and online.locator("#offline-note").count() == 0
