"""The run viewer over HTTP: login, cookie, CSRF, loopback-only open mode, pages and escaping."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.viewer.site import DELETED, ViewerSite, csrf_of, logged_in


def _ids(html: str) -> list[str]:
    """The run ids a runs page lists, in order."""
    return re.findall(r'<tr class="run" data-id="([^"]+)"', html)


def test_every_page_needs_a_login_first(site: ViewerSite) -> None:
    client = site.client()
    for path in ("/ui/", "/ui/run?id=weather-run", "/ui/?status=completed"):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/ui/login?next=")
        assert "weather" not in answer.text
    assert client.get("/", follow_redirects=True).url.path == "/ui/login"


def test_a_login_sets_a_signed_httponly_strict_cookie_and_returns_to_next(
        site: ViewerSite) -> None:
    client = site.client()
    page = client.get("/ui/login?next=/ui/run?id=weather-run")
    answer = client.post("/ui/login", data={"token": site.token, "csrf": csrf_of(page.text),
                                            "next": "/ui/run?id=weather-run"})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/run?id=weather-run"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert "path=/ui" in cookie
    assert site.token not in answer.headers["set-cookie"]  # the token itself is never kept
    assert client.get("/ui/run?id=weather-run").status_code == 200


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/chat",
                                    "/ui\\..\\x"])
def test_after_login_only_a_viewer_page_is_a_destination(site: ViewerSite, target: str) -> None:
    client = site.client()
    page = client.get("/ui/login")
    answer = client.post("/ui/login", data={"token": site.token, "csrf": csrf_of(page.text),
                                            "next": target})
    assert answer.headers["location"] == "/ui/"


def test_a_chat_token_a_wrong_token_and_a_revoked_one_do_not_log_in(site: ViewerSite) -> None:
    chat_token = site.host.tokens.create("peer")
    client = site.client()
    page = client.get("/ui/login")
    for token, why in ((chat_token, "That is a /chat token"),
                       ("dm_nonsense", "not an active viewer token"),
                       ("", "not an active viewer token")):
        answer = client.post("/ui/login", data={"token": token, "csrf": csrf_of(page.text)})
        assert answer.status_code == 401
        assert why in answer.text
    # A session stops working the moment its token is revoked, and a new token of the same
    # name (a rotation) does not revive it.
    logged = logged_in(site)
    assert logged.get("/ui/").status_code == 200
    site.host.tokens.revoke("alice")
    assert logged.get("/ui/").status_code == 303
    site.host.tokens.create("alice", scope="viewer")
    assert logged.get("/ui/").status_code == 303


def test_a_forged_or_tampered_cookie_is_a_new_visitor(site: ViewerSite) -> None:
    client = logged_in(site)
    value = client.cookies["dm_ui"]
    tampered = value[:-3] + ("AAA" if value[-3:] != "AAA" else "BBB")
    forged = site.client(cookies={"dm_ui": tampered})
    assert forged.get("/ui/").status_code == 303
    unsigned = site.client(cookies={"dm_ui": '{"n": "x", "t": "alice", "c": 0}'})
    assert unsigned.get("/ui/").status_code == 303


def test_logout_needs_its_csrf_token_then_ends_the_session(site: ViewerSite) -> None:
    client = logged_in(site)
    page = client.get("/ui/")
    assert client.post("/ui/logout", data={"csrf": "wrong"}).status_code == 403
    assert client.get("/ui/").status_code == 200
    copied = client.cookies["dm_ui"]  # a copy taken before signing out
    answer = client.post("/ui/logout", data={"csrf": csrf_of(page.text)})
    assert answer.status_code == 303
    client.cookies.clear()  # the browser drops the deleted cookie
    assert client.get("/ui/").status_code == 303
    # The login ended on the server too: the copy opens nothing.
    assert site.client(cookies={"dm_ui": copied}).get("/ui/").status_code == 303


def test_resume_refuses_a_post_without_csrf_or_from_another_origin(
        backend_site: ViewerSite) -> None:
    client = logged_in(backend_site)
    page = client.get("/ui/run?id=paused-run")
    csrf = csrf_of(page.text)
    refused = [
        client.post("/ui/resume", data={"id": "paused-run", "answer": "approve"}),
        client.post("/ui/resume", data={"id": "paused-run", "answer": "approve", "csrf": "0" * 64}),
        client.post("/ui/resume", data={"id": "paused-run", "answer": "approve", "csrf": csrf},
                    headers={"Origin": "http://evil.example"}),
    ]
    assert [answer.status_code for answer in refused] == [403, 403, 403]
    assert backend_site.host.transcripts.summary("paused-run").status == "awaiting_confirmation"
    assert DELETED == []
    answer = client.post("/ui/resume", data={"id": "paused-run", "answer": "approve", "csrf": csrf},
                         headers={"Origin": backend_site.url})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/run?id=paused-run&answered=approved"
    assert backend_site.host.transcripts.summary("paused-run").status == "completed"
    assert DELETED == ["/tmp/old.log"]
    again = client.post("/ui/resume", data={"id": "paused-run", "answer": "decline", "csrf": csrf})
    assert again.status_code == 409
    assert "not waiting for that answer" in again.text


def test_decline_answers_the_paused_call_as_declined(site: ViewerSite) -> None:
    client = logged_in(site)
    csrf = csrf_of(client.get("/ui/run?id=paused-run").text)
    client.post("/ui/resume", data={"id": "paused-run", "answer": "decline", "csrf": csrf})
    assert DELETED == []
    page = client.get("/ui/run?id=paused-run&answered=declined")
    assert "approval declined" in page.text
    assert "Declined: the run was told no." in page.text


def test_the_list_filters_and_pages(backend_site: ViewerSite) -> None:
    client = logged_in(backend_site)

    def listed(query: str) -> list[str]:
        page = client.get(f"/ui/{query}")
        assert page.status_code == 200
        return _ids(page.text)

    assert set(listed("")) == set(backend_site.runs.values())
    assert listed("?status=budget_exceeded") == ["research-run"]
    assert listed("?status=awaiting_confirmation") == ["paused-run"]
    assert listed("?q=weather") == ["weather-run"]
    assert listed("?q=nothing+like+this") == []
    assert listed("?mode=pipeline") == []
    assert client.get("/ui/?status=done").status_code == 400
    assert client.get("/ui/?after=garbage").status_code == 400
    for i in range(60):
        backend_site.host.transcripts.begin(f"extra-{i:02d}",
                                            [{"role": "user", "content": f"x {i}"}])
    first = client.get("/ui/").text
    assert 'rel="next"' in first
    older = first.split('rel="next" href="')[1].split('"')[0].replace("&amp;", "&")
    second = client.get(older).text
    ids = _ids(first) + _ids(second)
    assert len(ids) == len(set(ids)) == 64


def test_a_run_page_shows_the_timeline_the_verdict_and_the_budgets(
        backend_site: ViewerSite) -> None:
    client = logged_in(backend_site)
    research = client.get("/ui/run?id=research-run").text
    assert "Pressure caution on conversation_turns (1/3)" in research
    assert "Pressure warning on conversation_turns (2/3)" in research
    assert "conversation_turns spent (3/3, ceiling): the run stops." in research
    assert "Final summary by the model after 1 attempt(s)." in research
    assert 'class="bar stopped" data-budget="conversation_turns" data-percent="100"' in research
    assert "final summary" in research
    weather = client.get("/ui/run?id=weather-run").text
    assert "duplicate rejected" in weather
    assert "<details" in weather
    paused = client.get("/ui/run?id=paused-run").text
    assert "Waiting for a person" in paused
    assert "tool approval" in paused
    missing = client.get("/ui/run?id=no-such-run")
    assert missing.status_code == 404


def test_a_chat_session_shows_its_turn_count_and_limit(backend_site: ViewerSite) -> None:
    session = backend_site.host.chat_sessions.create(max_turns=7)
    backend_site.host.chat(session.id, "Compare the weather in Paris and Oslo.",
                   [backend_site.host.tools.tools()["lookup_weather"]], "scripted", "stand-in")
    page = logged_in(backend_site).get(f"/ui/run?id={session.id}").text
    assert "3 of 7 turns · active" in page


def test_html_and_script_in_a_transcript_are_shown_as_text(site: ViewerSite) -> None:
    client = logged_in(site)
    for path in ("/ui/", "/ui/run?id=hostile-run"):
        page = client.get(path)
        assert "<script>window.pwned" not in page.text
        assert "<img" not in page.text
        assert "<i>hostile</i>" not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["x-frame-options"] == "DENY"
    assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in client.get(
        "/ui/run?id=hostile-run").text


def test_the_open_viewer_needs_no_login_but_only_answers_loopback_names(
        open_site: ViewerSite) -> None:
    client = open_site.client()
    assert client.get("/ui/").status_code == 200
    assert "open on loopback" in client.get("/ui/").text
    # DNS rebinding: another site's name pointed at 127.0.0.1 reaches the port, not the runs.
    rebound = client.get("/ui/", headers={"Host": "evil.example"})
    assert rebound.status_code == 403
    assert "paused-run" not in rebound.text
    assert client.get("/ui/", headers={"Host": f"localhost:{open_site.server.port}"}
                      ).status_code == 200
    # Its forms still need their CSRF token.
    assert client.post("/ui/resume", data={"id": "paused-run", "answer": "approve"}
                       ).status_code == 403
    assert DELETED == []


@pytest.mark.parametrize("bind", ["0.0.0.0", "192.0.2.1", "example.com"])
def test_serve_refuses_ui_open_off_loopback(tmp_path: Path, bind: str) -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "datamachine", "--db", str(tmp_path / "d.db"), "serve",
         "--host", bind, "--ui-open"], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2
    assert "--ui-open serves the run viewer without a login" in answer.stderr
