"""The inspector page in a real browser: Debian's chromium, headless, driven by selenium through Debian's
chromedriver (given by path, so selenium never looks for or downloads a driver of its own).

A person's steps: open `/`, pick an example or paste a request, press Render, read the highlighted tokens.
The ids the page shows (each token's `data-id`) must be the ids the server's render route answers for the
same body; the same on a router, whose page also lists its workers. `/docs` and `/redoc` must come up with
nothing fetched from anywhere but the server.

Skipped, with the reason, where chromium or its driver is not installed (`make install-test` installs them).
Set TOKENFRONT_SCREENSHOTS=DIR to keep the screenshots (docs/images/ holds the ones the docs show).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WINDOW = (1280, 1000)
WAIT = 60.0  # seconds a page may take to show what a step waits for (a ceiling, not a measurement)
EXAMPLES = ["Plain chat", "With tools", "Multi-turn", "Completion"]

# Each prompt's tokens as the page shows them: its id (data-id) and its text (the span's own text nodes; the
# ↵ markers are elements of their own and not part of it).
READ_TOKENS = """
return [...document.querySelectorAll('#tokens .tokens-item')].map((item) =>
  [...item.querySelectorAll('.tok')].map((span) => [
    Number(span.dataset.id),
    [...span.childNodes].filter((node) => node.nodeType === Node.TEXT_NODE).map((node) => node.data).join(''),
    span.title,
  ]));
"""
# What the page fetched, besides itself: every entry must be on the page's own origin.
RESOURCES = "return performance.getEntriesByType('resource').map((entry) => entry.name);"


def _not_installed() -> str | None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless chromium for the module, with a new empty profile."""
    reason = _not_installed()
    if reason:
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tokenfront-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, condition: Callable[[Any], Any], what: str, *, poll: float = 0.1) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=poll).until(condition, message=f"waiting for {what}")


def by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def open_page(driver: Any, url: str) -> str:
    """Open the inspector and wait for its /server_info call to end; the server line's state ("ok"/"error")."""
    driver.set_window_size(*WINDOW)
    driver.get(f"{url}/")
    return str(
        wait_for(driver, lambda d: by_id(d, "server-line").get_attribute("data-state"), "/server_info")
    )


def press_render(driver: Any) -> tuple[str, str]:
    """Press Render and wait for the outcome: (state, message) of the status line."""
    status = by_id(driver, "render-status")
    done = int(status.get_attribute("data-renders") or 0)
    by_id(driver, "render-button").click()
    wait_for(driver, lambda d: int(status.get_attribute("data-renders") or 0) > done, "the render to finish")
    return str(status.get_attribute("data-state")), str(status.text)


def pick_example(driver: Any, name: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(by_id(driver, "example")).select_by_visible_text(name)


def page_request(driver: Any) -> tuple[str, str]:
    """The route and the body the page sends (what its controls hold)."""
    route = driver.execute_script("return document.getElementById('route').value;")
    body = driver.execute_script("return document.getElementById('request-body').value;")
    return str(route), str(body)


def direct_ids(url: str, route: str, body: str, headers: dict[str, str] | None = None) -> list[list[int]]:
    """The ids of the same body from the route itself: one list per prompt."""
    answer = httpx.post(
        f"{url}{route}",
        content=body,
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    items = answer.json()
    return [item["token_ids"] for item in (items if isinstance(items, list) else [items])]


def assert_same_origin(driver: Any, url: str) -> int:
    resources = driver.execute_script(RESOURCES)
    foreign = [name for name in resources if not name.startswith(f"{url}/")]
    assert foreign == [], f"fetched from elsewhere: {foreign}"
    return len(resources)


def screenshot(driver: Any, name: str, tmp_path: Path) -> Path:
    """A PNG of the whole page (the window grown to the page's height); copied to $TOKENFRONT_SCREENSHOTS."""
    height = driver.execute_script("return document.documentElement.scrollHeight;")
    chrome = driver.execute_script("return window.outerHeight - window.innerHeight;")
    driver.set_window_size(WINDOW[0], min(int(height) + int(chrome), 4000))
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("TOKENFRONT_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / path.name)
    driver.set_window_size(*WINDOW)
    return path


def hover(driver: Any, element: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element(element).perform()


# --- the renderer ---------------------------------------------------------------------------------------


def test_every_example_shows_the_ids_the_render_route_answers(browser: Any, qwen3_renderer: Any) -> None:
    url = qwen3_renderer.url
    assert open_page(browser, url) == "ok"
    info = httpx.get(f"{url}/server_info", timeout=10).json()
    line = by_id(browser, "server-line").text
    assert "role renderer" in line and "model Qwen3-0.6B" in line and "reasoning parser qwen3" in line
    assert by_id(browser, "fingerprint-digest").text == info["render_fingerprint"]["digest"]
    assert by_id(browser, "workers-section").is_displayed() is False  # a renderer has no workers

    options = browser.execute_script(
        "return [...document.querySelectorAll('#example option')].map(o => o.text);"
    )
    assert options == EXAMPLES
    compared_tokens = 0
    split_characters = []
    for name in EXAMPLES:
        pick_example(browser, name)
        route, body = page_request(browser)
        state, message = press_render(browser)
        assert state == "rendered", f"{name}: {message}"
        shown = browser.execute_script(READ_TOKENS)
        expected = direct_ids(url, route, body)
        assert [[token[0] for token in item] for item in shown] == expected, name
        total = sum(len(ids) for ids in expected)
        assert message == f"Rendered: {total} tokens."
        # The page's JSON view is the route's answer.
        answer = json.loads(by_id(browser, "response-json").get_attribute("textContent"))
        answer_items = answer if isinstance(answer, list) else [answer]
        assert [item["token_ids"] for item in answer_items] == expected
        for item, ids in zip(shown, expected, strict=True):
            # Each token's text and title come from that id; together the texts are the whole prompt
            # (when no token holds only part of a character, which decodes to U+FFFD on its own).
            assert all(
                title.startswith(f"#{index} · id {ids[index]} · ") for index, (_, _, title) in enumerate(item)
            )
            text = "".join(piece for _, piece, _ in item)
            whole = httpx.post(f"{url}/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]
            if "\ufffd" in text:
                # Only where the prompt has a character of several bytes, which two tokens may share.
                assert "\ufffd" not in whole and any(ord(char) > 127 for char in whole), name
                split_characters.append(name)
            else:
                assert text == whole, name
        compared_tokens += total
    assert compared_tokens > 200  # the tools example alone is 172 Qwen3 tokens
    assert split_characters in ([], ["Multi-turn"])  # the one example with such characters


def test_a_pasted_request_and_its_mistakes(browser: Any, qwen3_renderer: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    url = qwen3_renderer.url
    assert open_page(browser, url) == "ok"
    area = by_id(browser, "request-body")
    pasted = {
        "messages": [{"role": "user", "content": 'Is <b>this</b> & "that" markup?\nNo.'}],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    area.clear()
    area.send_keys(json.dumps(pasted))
    state, message = press_render(browser)
    assert state == "rendered", message
    shown = browser.execute_script(READ_TOKENS)
    route, body = page_request(browser)
    assert json.loads(body) == pasted
    assert [[token[0] for token in item] for item in shown] == direct_ids(url, route, body)
    # The text stays text: no element was made of it, and its pieces hold the characters.
    assert browser.find_elements(By.CSS_SELECTOR, "#tokens b") == []
    pieces = "".join(piece for _, piece, _ in shown[0])
    assert '<b>this</b> & "that" markup?\nNo.' in pieces
    assert len(browser.find_elements(By.CSS_SELECTOR, "#tokens .mark")) == pieces.count("\n")

    # Hovering a token names its position, id and text.
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")
    hover(browser, tokens[3])
    wait_for(browser, lambda d: by_id(d, "token-hover").text.startswith("token #3 · id "), "the hover line")
    assert by_id(browser, "token-hover").text.startswith(f"token #3 · id {shown[0][3][0]} · ")

    area.clear()
    area.send_keys('{"messages": [')
    state, message = press_render(browser)
    assert state == "error" and message.startswith("The request body is not JSON: "), message
    area.clear()
    area.send_keys('{"messages": [{"role": "user", "content": "hi"}], "model": "no-such-model"}')
    state, message = press_render(browser)
    assert state == "error" and message.startswith("404 from /v1/chat/completions/render: "), message
    assert "no-such-model" in message

    # The screenshot the docs show: an example with a system prompt, a token hovered.
    pick_example(browser, "Multi-turn")
    assert press_render(browser)[0] == "rendered"
    hover(browser, browser.find_elements(By.CSS_SELECTOR, "#tokens .tok")[14])
    screenshot(browser, "inspector", tmp_path)
    assert_same_origin(browser, url)


def test_the_page_asks_for_the_api_key(
    browser: Any, launch: Callable[..., Any], qwen3: Path, tmp_path: Path
) -> None:
    server = launch(["render", "--model", str(qwen3), "--api-key", "s3cret"], log_dir=tmp_path)
    try:
        assert open_page(browser, server.url) == "error"
        assert "401 from /server_info" in by_id(browser, "server-line").text
        assert "type the server's API key above" in by_id(browser, "server-line").text
        by_id(browser, "api-key").send_keys("s3cret")
        by_id(browser, "key-form").submit()
        wait_for(
            browser, lambda d: by_id(d, "server-line").get_attribute("data-state") == "ok", "the key to work"
        )
        assert "role renderer" in by_id(browser, "server-line").text
        state, message = press_render(browser)
        assert state == "rendered", message
        route, body = page_request(browser)
        shown = browser.execute_script(READ_TOKENS)
        expected = direct_ids(server.url, route, body, headers={"Authorization": "Bearer s3cret"})
        assert [[token[0] for token in item] for item in shown] == expected
        # The key lives in the page only: a reload forgets it.
        assert open_page(browser, server.url) == "error"
        assert browser.execute_script(
            "return [localStorage.length, sessionStorage.length, document.cookie];"
        ) == [
            0,
            0,
            "",
        ]
    finally:
        assert server.stop() == 0


def test_docs_and_redoc_come_up_offline(browser: Any, qwen3_renderer: Any) -> None:
    from selenium.webdriver.common.by import By

    url = qwen3_renderer.url
    browser.get(f"{url}/docs")
    title = wait_for(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"), "Swagger UI"
    )
    assert title[0].text.startswith("tokenfront renderer")
    operations = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".opblock"), "the operations")
    paths = {op.find_element(By.CSS_SELECTOR, ".opblock-summary-path").text for op in operations}
    assert "/v1/chat/completions/render" in paths and "/tokenize" in paths
    assert assert_same_origin(browser, url) >= 3  # the bundle, its CSS, /openapi.json

    browser.get(f"{url}/redoc")
    heading = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "h1"), "ReDoc")
    assert heading[0].text.startswith("tokenfront renderer")
    assert assert_same_origin(browser, url) >= 2


# --- the router and its worker ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_router_page_lists_its_workers(
    browser: Any, launch: Callable[..., Any], checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    tiny = str(checkpoint("tiny-random"))
    worker = launch(
        ["serve", "--model", tiny, "--served-model-name", "tiny"],
        log_dir=tmp_path,
        env={"TOKENFRONT_ENABLE_RENDER_ENDPOINTS": "1"},
        timeout=240.0,
    )
    down = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    router = None
    try:
        router = launch(
            [
                "route",
                "--model",
                tiny,
                "--served-model-name",
                "tiny",
                "--worker",
                worker.url,
                "--worker",
                down,
                "--health-interval",
                "0.5",
            ],
            log_dir=tmp_path,
        )
        assert open_page(browser, router.url) == "ok"
        assert "role router" in by_id(browser, "server-line").text
        assert by_id(browser, "workers-section").is_displayed()

        def rows(driver: Any) -> dict[str, list[str]]:
            found = driver.find_elements(By.CSS_SELECTOR, "#workers-body tr[data-url]")
            return {
                row.get_attribute("data-url"): [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
                for row in found
            }

        def settled(driver: Any) -> dict[str, list[str]] | None:
            table = rows(driver)
            by_id(driver, "workers-refresh").click()  # the next poll sees this refresh
            states = {url: cells[1].split("\n")[0] for url, cells in table.items()}
            return table if states == {worker.url: "healthy", down: "unhealthy"} else None

        table = wait_for(browser, settled, "the worker states", poll=0.5)
        assert len(table) == 2
        live = table[worker.url]
        assert live[2] == "tiny"
        assert "matches the router" in live[3] and live[4] == "fingerprint match"
        assert live[5].startswith("0 active · 0 routed · 0 failures")
        assert table[down][1].startswith("unhealthy\n")  # and the problem under it
        assert by_id(browser, "gate-line").text == "Forwarding rendered ids: yes"

        # The router renders too (it has a tokenizer): same ids as its render route.
        state, message = press_render(browser)
        assert state == "rendered", message
        route, body = page_request(browser)
        shown = browser.execute_script(READ_TOKENS)
        assert [[token[0] for token in item] for item in shown] == direct_ids(router.url, route, body)
        screenshot(browser, "inspector-router", tmp_path)
        assert_same_origin(browser, router.url)

        # The worker's own page (its render routes are on) renders the same ids.
        assert open_page(browser, worker.url) == "ok"
        assert "role worker" in by_id(browser, "server-line").text
        assert not by_id(browser, "workers-section").is_displayed()
        assert press_render(browser)[0] == "rendered"
        assert [[token[0] for token in item] for item in browser.execute_script(READ_TOKENS)] == [
            [token[0] for token in item] for item in shown
        ]
    finally:
        if router is not None:
            assert router.stop() == 0
        assert worker.stop() == 0
