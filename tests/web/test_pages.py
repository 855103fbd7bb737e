"""The console's pages as HTML: each renders, what a request puts into a page is escaped, the
CSRF token and the role reach the page, the static files are served, and the script writes
farm data only as text (the browser half of that is in test_browser.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from services.web import pages
from tests.web.pagesapp import pages_app, serving

SCRIPT = "<script>alert(1)</script>"
Client = TestClient[web.Request, web.Application]
PAGES = ["/", "/jobs/0190f3a2-7c1e-7abc-8def-0123456789ab", "/dlq", "/workers"]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with serving(pages_app()) as server:
        client: Client = TestClient(server)
        try:
            yield client
        finally:
            await client.close()


async def _page(
    client: Client, path: str, status: int = 200, headers: dict[str, str] | None = None
) -> str:
    response = await client.get(path, headers=headers or {})
    text = await response.text()
    assert response.status == status, text
    assert response.content_type == "text/html"
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    return text


@pytest.mark.parametrize("path", PAGES)
async def test_each_page_renders_its_shell_with_the_console_script(
    client: Client, path: str
) -> None:
    html = await _page(client, path)
    assert re.search(r'<script src="/static/console\.js\?v=[^"]+" defer></script>', html)
    assert re.search(r'<link rel="stylesheet" href="/static/console\.css\?v=[^"]+">', html)
    for link in ('href="/"', 'href="/dlq"', 'href="/workers"'):
        assert link in html
    assert "<script>" not in html, "no inline script: the CSP forbids it"
    page = {"/": "jobs", "/dlq": "dlq", "/workers": "workers"}.get(path, "job")
    assert f'data-page="{page}"' in html


async def test_the_static_files_are_served(client: Client) -> None:
    for name, kind in (("console.js", "javascript"), ("console.css", "text/css")):
        response = await client.get(f"/static/{name}")
        assert response.status == 200
        assert kind in response.headers["Content-Type"]
        assert await response.read() == (pages.STATIC / name).read_bytes()
    assert (await client.get("/static/../pages.py")).status in (403, 404)


async def test_filters_taken_from_the_query_are_escaped(client: Client) -> None:
    async def page(path: str, **params: str) -> str:
        response = await client.get(path, params=params)
        assert response.status == 200
        return await response.text()

    html = await page("/", project=SCRIPT, state="queued")
    assert SCRIPT not in html
    assert 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    assert '<option value="queued" selected>' in html
    breakout = '"><img src=x onerror=alert(1)>'
    html = await page("/", project=breakout)
    assert breakout not in html and 'value="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in html
    html = await page("/dlq", job_id=SCRIPT)
    assert SCRIPT not in html and 'value="&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    html = await page("/", state=SCRIPT)
    assert SCRIPT not in html and " selected" not in html, "an unknown state selects nothing"


async def test_a_job_id_that_is_not_one_gets_a_404_page_with_the_text_escaped(
    client: Client,
) -> None:
    html = await _page(client, "/jobs/%3Cscript%3Ealert(1)%3C%2Fscript%3E", status=404)
    assert SCRIPT not in html
    assert '<code id="missing">&lt;script&gt;alert(1)&lt;/script&gt;</code>' in html


@pytest.mark.parametrize("path", PAGES)
async def test_the_csrf_token_reaches_the_meta_tag_and_the_logout_form_escaped(
    client: Client, path: str
) -> None:
    html = await _page(client, path, headers={"X-Test-Csrf": 'tok"><script>x</script>'})
    escaped = "tok&#34;&gt;&lt;script&gt;x&lt;/script&gt;"
    assert f'<meta name="csrf-token" content="{escaped}">' in html
    assert f'<input type="hidden" name="csrf_token" value="{escaped}">' in html
    assert '<form class="logout" method="post" action="/logout">' in html


async def test_without_a_middleware_token_the_csrf_cookie_is_used(client: Client) -> None:
    client.session.cookie_jar.update_cookies({pages.CSRF_COOKIE: "from-cookie"})
    html = await _page(client, "/dlq")
    assert '<meta name="csrf-token" content="from-cookie">' in html


@pytest.mark.parametrize("path", PAGES)
async def test_operator_buttons_are_enabled_for_operators_only(client: Client, path: str) -> None:
    def buttons(html: str) -> list[str]:
        return re.findall(r"<button[^>]*class=\"op[^\"]*\"[^>]*>", html)

    operator = await _page(client, path, headers={"X-Test-Role": "operator"})
    viewer = await _page(client, path, headers={"X-Test-Role": "viewer"})
    anonymous = await _page(client, path)
    forged = await _page(client, path, headers={"X-Test-Role": "admin"})
    assert 'data-role="operator"' in operator and 'data-role="viewer"' in viewer
    assert 'data-role="viewer"' in anonymous and 'data-role="viewer"' in forged
    if path == "/workers":
        assert not buttons(operator), "the workers page changes nothing"
        return
    assert buttons(operator) and not any("disabled" in b for b in buttons(operator))
    for html in (viewer, anonymous, forged):
        assert buttons(html) and all("disabled" in b for b in buttons(html)), html


def test_the_script_never_writes_data_as_html() -> None:
    """Every value goes through textContent or a DOM property (test_browser.py checks it in
    Chromium): none of the HTML-parsing sinks appears in the script."""
    script = (pages.STATIC / "console.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function"):  # fmt: skip
        assert sink not in script, sink
    assert "http://" not in script and "https://" not in script, "same origin only"


def test_nothing_is_loaded_from_another_origin() -> None:
    for path in [*Path(pages.TEMPLATES).glob("*.html"), pages.STATIC / "console.css"]:
        text = path.read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path
