"""The run viewer in a real headless browser (the system's Chromium, driven by Playwright).

Also makes the screenshots of docs/viewer.md: run with ``DATAMACHINE_SCREENSHOTS=docs/images``.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path
from typing import Any

from PIL import Image

from tests.exactly_once.crash_tools import LEDGER
from tests.viewer.site import DELETED, ViewerSite, doubt_run, http_run

WIDE = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


def _log_in(page: Any, site: ViewerSite) -> None:
    page.goto(f"{site.url}/ui/")
    assert page.url.startswith(f"{site.url}/ui/login")
    page.fill("#token", site.token)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site.url}/ui/")


def test_log_in_filter_open_a_run_and_expand_a_tool_call(browser: Any, site: ViewerSite,
                                                         shots: Path) -> None:
    page = browser.new_page(viewport=WIDE)
    page.goto(f"{site.url}/ui/")
    page.screenshot(path=shots / "viewer-login.png")
    _log_in(page, site)
    assert page.locator("tr.run").count() == 4
    page.screenshot(path=shots / "viewer-runs.png", full_page=True)

    page.select_option("select[name=status]", "budget_exceeded")
    page.click("form.filters button")
    page.wait_for_url("**/ui/?status=budget_exceeded**")
    assert page.locator("tr.run").all_inner_texts()[0].startswith(
        "Research the history of the bicycle.")
    assert page.locator("tr.run").count() == 1

    page.fill("input[name=q]", "weather")
    page.select_option("select[name=status]", "")
    page.click("form.filters button")
    page.wait_for_url("**q=weather**")
    assert page.locator("tr.run").count() == 1
    page.click("tr.run a.title")
    page.wait_for_url(f"{site.url}/ui/run?id=weather-run")

    call = page.locator("details.tool_call").first
    parameters = call.locator("pre")
    assert not parameters.is_visible()  # collapsed until clicked
    call.locator("summary").click()
    assert parameters.is_visible()
    assert '"city": "Paris"' in parameters.inner_text()
    assert page.locator(".flag", has_text="duplicate rejected").count() == 1

    page.goto(f"{site.url}/ui/run?id=research-run")
    assert page.locator(".item.mark").count() == 4  # two pressure tiers, the stop, the summary
    page.screenshot(path=shots / "viewer-run.png", full_page=True)
    phone = browser.new_page(viewport=PHONE)
    phone.context.add_cookies(page.context.cookies())
    phone.goto(f"{site.url}/ui/")
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    phone.screenshot(path=shots / "viewer-phone.png", full_page=True)
    phone.close()
    page.close()


def test_approve_resumes_a_paused_run(browser: Any, site: ViewerSite, shots: Path) -> None:
    page = browser.new_page(viewport=WIDE)
    _log_in(page, site)
    page.select_option("select[name=status]", "awaiting_confirmation")
    page.click("form.filters button")
    page.click("tr.run a.title")
    page.wait_for_url(f"{site.url}/ui/run?id=paused-run")
    assert page.locator(".pending").inner_text().count("delete_file") == 1
    page.screenshot(path=shots / "viewer-paused.png", full_page=True)
    page.click("button.approve")
    page.wait_for_url(f"{site.url}/ui/run?id=paused-run&answered=approved")
    assert page.locator(".notice").inner_text() == "Approved: the run went on."
    assert page.locator(".pending").count() == 0
    assert page.locator(".badge").first.inner_text() == "completed"
    assert "Done: deleted /tmp/old.log" in page.locator(".verdict").inner_text()
    assert DELETED == ["/tmp/old.log"]
    page.close()


def test_a_call_in_doubt_is_recorded_from_the_viewer(browser: Any, site: ViewerSite,
                                                     shots: Path) -> None:
    session = doubt_run(site.host)
    page = browser.new_page(viewport=WIDE)
    _log_in(page, site)
    page.goto(f"{site.url}/ui/run?id={session}")
    card = page.locator(".pending")
    assert "may or may not have happened" in card.inner_text()
    assert card.locator("button").all_inner_texts() == [
        "It did not happen: run it again", "It did not happen: do not run it",
        "Record it and go on"]
    page.screenshot(path=shots / "viewer-in-doubt.png", full_page=True)
    page.fill("form.resolve input[name=result]", "sent at 10:02, seen in the outbox")
    page.click("button.resolve")
    page.wait_for_url(f"{site.url}/ui/run?id={session}&answered=resolved")
    assert page.locator(".notice").inner_text() == (
        "Recorded: the call is settled and the run went on.")
    assert page.locator(".pending").count() == 0
    assert "Done: sent at 10:02, seen in the outbox" in page.locator(".verdict").inner_text()
    assert len(LEDGER) == 1  # the mail went out once, before the crash
    page.close()


def _colours(png: bytes) -> list[tuple[int, int, int]]:
    """The colours along the middle row of a screenshot, left to right."""
    image = Image.open(BytesIO(png)).convert("RGB")
    return [image.getpixel((x, image.height // 2)) for x in range(image.width)]  # type: ignore[misc]


def _is_red(rgb: tuple[int, int, int]) -> bool:
    return rgb[0] > 180 and rgb[1] < 90 and rgb[2] < 90


def _is_grey_blue(rgb: tuple[int, int, int]) -> bool:
    return 100 < rgb[0] < 140 and 120 < rgb[1] < 160 and 140 < rgb[2] < 180


def test_budget_bars_render_their_share_and_the_stopping_one_in_red(
        browser: Any, site: ViewerSite, shots: Path) -> None:
    page = browser.new_page(viewport=WIDE, device_scale_factor=1)
    _log_in(page, site)
    stopped = page.locator('tr[data-id="research-run"] .bar.stopped svg')
    weather = page.locator('tr[data-id="weather-run"] .bar[data-budget="conversation_turns"] svg')
    (shots / "viewer-bars.png").write_bytes(
        page.locator('tr[data-id="research-run"] .bars').screenshot())

    full = _colours(stopped.screenshot())
    assert sum(map(_is_red, full)) >= 0.9 * len(full)  # 3/3: all of it, in red

    partial = _colours(weather.screenshot())
    share = sum(map(_is_grey_blue, partial)) / len(partial)
    assert not any(map(_is_red, partial))
    # 3 of 25 turns: about 12 % of the bar is filled, the rest is the track.
    assert 0.06 <= share <= 0.2, share
    page.close()


def test_a_transcript_holding_script_runs_nothing_and_shows_it_as_text(
        browser: Any, site: ViewerSite) -> None:
    page = browser.new_page(viewport=WIDE)
    violations: list[str] = []
    page.on("console", lambda message: violations.append(message.text))
    _log_in(page, site)
    for path in ("/ui/", "/ui/run?id=hostile-run"):
        page.goto(f"{site.url}{path}")
        assert page.evaluate("typeof window.pwned") == "undefined"
        assert page.locator("main script, main img, main b, main i").count() == 0
    assert "<script>window.pwned = 1</script>" in page.locator(".verdict").inner_text()
    assert page.evaluate("document.scripts.length") == 0
    page.close()


@contextmanager
def _other_site(html: str) -> Iterator[str]:
    """A page on another origin (another port of loopback), as an attacker's site."""
    body = html.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_cross_site_post_is_refused(browser: Any, site: ViewerSite) -> None:
    page = browser.new_page(viewport=WIDE)
    _log_in(page, site)  # the person is signed in to the viewer in this browser
    attack = f"""<!doctype html><body>
      <form id="f" method="post" action="{site.url}/ui/resume">
        <input name="id" value="paused-run">
        <input name="answer" value="approve"><input name="csrf" value="{'0' * 64}">
      </form><script>document.getElementById('f').submit()</script></body>"""
    with _other_site(attack) as evil:
        with page.expect_response(f"{site.url}/ui/resume") as answer:
            page.goto(evil)
        assert answer.value.status == 403
    assert site.host.transcripts.summary("paused-run").status == "awaiting_confirmation"
    assert DELETED == []
    page.close()


_OVERFLOW = ("() => [...document.querySelectorAll('.table-wrap')]"
             ".map(wrap => wrap.scrollWidth - wrap.clientWidth)")


def test_a_runs_requests_and_every_table_fit_a_1280_pixel_window(
        browser: Any, site: ViewerSite, shots: Path) -> None:
    # The runs list's budgets column was cut off (the table scrolled) in a window narrower
    # than 1240 pixels: a 1280-pixel screen with a side panel, a 1024-pixel laptop.
    # Playwright keeps an event loop running on this thread: the run goes on another one.
    with ThreadPoolExecutor(1) as pool:
        session = pool.submit(http_run, site.host).result(timeout=60)
    page = browser.new_page(viewport=WIDE)
    _log_in(page, site)
    assert page.locator("tr.run").count() == 5
    assert page.evaluate(_OVERFLOW) == [0]
    narrow = browser.new_page(viewport={"width": 1024, "height": 768})
    narrow.context.add_cookies(page.context.cookies())
    narrow.goto(f"{site.url}/ui/")
    assert narrow.evaluate(_OVERFLOW) == [0]
    narrow.close()
    page.goto(f"{site.url}/ui/run?id={session}")
    requests = page.locator("table.requests")
    assert requests.locator("tr.request").count() == 2
    assert requests.locator("tr.attempt").inner_text().startswith("1.1\tTurn 1\tHTTP 503")
    assert page.evaluate(_OVERFLOW) == [0]
    page.screenshot(path=shots / "viewer-requests.png", full_page=True)
    page.close()
