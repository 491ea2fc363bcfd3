"""The /chat server under hostile and careless input (DESIGN.md 20), against a real server
process on loopback: session theft, header forgery, tools a token may not reach, SSRF through
``fetch_url``, rate limits, a misconfigured site, and error bodies that name no server path.

Every run here is bounded: the directive model answers in one or two turns.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import httpx
import pytest

from datamachine.server.chain import (
    HEADER_CALLER_AGENT,
    HEADER_CALLER_SITE,
    HEADER_CHAIN_SITES,
)
from tests.hostile.conftest import ROOT, Served, assert_no_paths, serving


def error(served: Served, response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The error body, after checking its status, its code and that it names no path."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code, body
    assert_no_paths(served, response)
    return dict(body)


def answer(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["final_content"])


# -- sessions belong to the token that created them --------------------------------------------

def test_another_token_can_neither_continue_nor_read_a_session(served: Served) -> None:
    alice, bob = served.token("alice"), served.token("bob")
    first = served.post(alice, {"message": "the launch code is 0000"})
    session_id = first.json()["transcript_session_id"]

    stolen = served.post(bob, {"message": "what was said?", "session_id": session_id})
    unknown = served.post(bob, {"message": "x", "session_id": f"no-{uuid.uuid4().hex}"})
    assert error(served, stolen, 404, "session_not_found") == error(
        served, unknown, 404, "session_not_found")  # the same words: nothing learned
    assert "0000" not in stolen.text
    resumed = served.post(bob, {"resume": {"approve": True}, "session_id": session_id})
    assert error(served, resumed, 404, "session_not_found") == unknown.json()

    again = served.post(alice, {"message": "and now?", "session_id": session_id})
    assert "0000" in json.dumps(again.json()["messages"])
    assert served.host.transcripts.summary(session_id).token_name == "alice"
    assert served.host.chat_sessions.get(session_id).token_name == "alice"

    served.host.tokens.revoke("alice")  # the creator's token goes: nobody else inherits
    error(served, served.post(alice, {"message": "x", "session_id": session_id}), 401,
          "datamachine_unauthorized")
    error(served, served.post(bob, {"message": "x", "session_id": session_id}), 404,
          "session_not_found")
    assert served.host.transcripts.summary(session_id).message_count == 4


def test_a_session_made_through_the_python_api_is_not_open_to_callers(served: Served) -> None:
    session = served.host.chat_sessions.create()
    token = served.token("carol")
    error(served, served.post(token, {"message": "x", "session_id": session.id}), 404,
          "session_not_found")


def test_streaming_to_another_tokens_session_is_a_plain_404(served: Served) -> None:
    owner, thief = served.token("olivia"), served.token("peggy")
    session_id = served.post(owner, {"message": "mine"}).json()["transcript_session_id"]
    stolen = served.post(thief, {"message": "x", "session_id": session_id, "stream": True})
    assert stolen.headers["content-type"].startswith("application/json")
    error(served, stolen, 404, "session_not_found")
    assert "streamed /chat failed" not in served.log_text()


def test_a_spent_session_window_tells_another_token_nothing(served: Served) -> None:
    owner, thief = served.token("quentin", tools=[]), served.token("rupert")
    served.host.settings.set("spend_limits", [{"name": "per_session", "budget": "total_tokens",
                                               "window": "day", "limit": 500,
                                               "scope": "session"}])
    try:
        first = served.post(owner, {"message": "spend 1000"})
        session_id = first.json()["transcript_session_id"]
        own = served.post(owner, {"message": "more", "session_id": session_id})
        assert error(served, own, 429, "spend_limit_reached")  # the owner is told
        stolen = served.post(thief, {"message": "x", "session_id": session_id})
        assert error(served, stolen, 404, "session_not_found")["data"] == {}
    finally:
        served.host.settings.delete("spend_limits")


def test_a_resumed_run_gets_the_tools_its_token_reaches_now(served: Served) -> None:
    token = served.token("sybil", tools=["approve_me"])
    paused = served.post(token, {"message": "call approve_me {}", "confirmation": "pause"})
    assert paused.json()["status"] == "awaiting_confirmation", paused.text
    session_id = paused.json()["transcript_session_id"]
    served.host.tokens.revoke("sybil")  # the operator narrows the name while the run waits
    narrowed = served.token("sybil", tools=[])
    resumed = served.post(narrowed, {"session_id": session_id, "resume": {"approve": True}})
    assert resumed.status_code == 200, resumed.text
    assert "approved-tool-ran" not in resumed.text


# -- caller headers never widen what a token may reach -----------------------------------------

def test_a_token_made_for_no_site_may_not_claim_one(served: Served) -> None:
    token = served.token("dave")
    before = len(served.host.transcripts.list(limit=10_000))
    for header, value in ((HEADER_CALLER_SITE, "trusted-site"), (HEADER_CALLER_AGENT, "admin")):
        body = error(served, served.post(token, {"message": "x"}, headers={header: value}), 403,
                     "caller_not_allowed")
        assert body["data"]["header"] == header
    assert len(served.host.transcripts.list(limit=10_000)) == before  # nothing ran


def test_a_site_token_claims_its_own_site_only(served: Served) -> None:
    token = served.token("from-beta", site="beta")
    body = error(served, served.post(token, {"message": "x"},
                                     headers={HEADER_CALLER_SITE: "gamma"}), 403,
                 "caller_not_allowed")
    assert body["data"]["header"] == HEADER_CALLER_SITE
    # Without the header the run still knows who called: the token says so.
    seen = json.loads(answer(served.post(token, {"message": "whoami"},
                                         headers={HEADER_CALLER_AGENT: "planner"})))
    assert seen["caller_context"]["caller_site"] == "beta"
    assert seen["caller_context"]["caller_agent"] == "planner"


def test_a_forged_list_of_sites_only_refuses_more(served: Served) -> None:
    from datamachine.server.site import ensure_site_id

    token = served.token("erin")
    own = ensure_site_id(served.host)
    error(served, served.post(token, {"message": "x"}, headers={HEADER_CHAIN_SITES: own}), 409,
          "datamachine_chain_cycle")


# -- tools --------------------------------------------------------------------------------------

def tools_seen(served: Served, token: str) -> list[str]:
    return list(json.loads(answer(served.post(token, {"message": "tools?"}))))


def test_tools_follow_the_token_then_the_setting(served: Served) -> None:
    everyone = served.token("frank")
    assert {"read_secret", "fetch_url", "call_remote_agent"} <= set(tools_seen(served, everyone))
    narrow = served.token("grace", tools=["read_secret"])
    nothing = served.token("heidi", tools=[])
    assert tools_seen(served, narrow) == ["read_secret"]
    assert tools_seen(served, nothing) == []
    served.host.settings.set("chat_tools", ["fetch_url"])
    try:
        assert tools_seen(served, everyone) == ["fetch_url"]
        assert tools_seen(served, narrow) == ["read_secret"]  # the token's own list wins
    finally:
        served.host.settings.delete("chat_tools")


def test_a_tool_the_token_may_not_use_does_not_run(served: Served) -> None:
    token = served.token("ivan", tools=[])
    response = served.post(token, {"message": "call read_secret {}"})
    assert response.status_code == 200
    assert "s3cret" not in response.text


# -- fetch_url and server-side request forgery -------------------------------------------------

class RecordingServer(ThreadingHTTPServer):
    """A loopback server that records the paths it served and redirects ``/away``."""

    def __init__(self, address: str, redirect_to: str | None) -> None:
        super().__init__((address, 0), _Recorder)
        self.paths: list[str] = []
        self.redirect_to = redirect_to


class _Recorder(BaseHTTPRequestHandler):
    """Redirects ``/away`` to the server's ``redirect_to``; records every path it served."""

    server: RecordingServer

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        target = self.server.redirect_to
        if self.path == "/away" and target:
            self.send_response(302)
            self.send_header("Location", target)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def http_server(address: str, redirect_to: str | None = None
                ) -> Iterator[RecordingServer]:
    with serving(RecordingServer(address, redirect_to)) as server:
        yield cast(RecordingServer, server)


def fetch_result(served: Served, token: str, url: str) -> str:
    return answer(served.post(token, {"message": f"call fetch_url {json.dumps({'url': url})}"}))


def test_fetch_url_refuses_private_addresses(served: Served) -> None:
    token = served.token("judy", tools=["fetch_url"])
    with http_server("127.0.0.1") as inside:
        port = inside.server_address[1]
        for url in (f"http://127.0.0.1:{port}/", f"http://localhost:{port}/",
                    "http://169.254.169.254/latest/meta-data/", f"http://[::1]:{port}/",
                    "http://10.0.0.1/", "http://0.0.0.0/"):
            said = fetch_result(served, token, url)
            assert "fetch_url refused" in said, (url, said)
            assert "fetch_allow_private" in said, (url, said)
        assert inside.paths == []  # nothing reached the loopback server
        served.host.settings.set("fetch_allow_private", True)
        try:
            said = fetch_result(served, token, f"http://127.0.0.1:{port}/ok")
            assert '"status":200' in said, said
        finally:
            served.host.settings.delete("fetch_allow_private")
        assert inside.paths == ["/ok"]


def test_fetch_url_refuses_a_redirect_to_a_private_address(served: Served) -> None:
    token = served.token("ken", tools=["fetch_url"])
    with http_server("127.0.0.1") as inside:
        target = f"http://127.0.0.1:{inside.server_address[1]}/internal"
        with http_server("127.0.0.2", redirect_to=target) as allowed:
            served.host.settings.set("fetch_allow_private", ["127.0.0.2/32"])
            try:
                said = fetch_result(served, token,
                                    f"http://127.0.0.2:{allowed.server_address[1]}/away")
            finally:
                served.host.settings.delete("fetch_allow_private")
            assert allowed.paths == ["/away"]
        assert "fetch_url refused http://127.0.0.1" in said, said
        assert inside.paths == []


# -- rate limits --------------------------------------------------------------------------------

def test_a_token_over_its_rate_gets_429_with_retry_after(served: Served) -> None:
    busy, calm = served.token("leo"), served.token("mallory")
    served.host.settings.set("chat_rate_limit", 3)
    try:
        assert [served.post(busy, {"message": "x"}).status_code for _ in range(3)] == [200] * 3
        refused = served.post(busy, {"message": "x"})
        body = error(served, refused, 429, "rate_limited")
        assert body["data"]["limit"] == "chat_rate_limit"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert served.post(calm, {"message": "x"}).status_code == 200  # per token
    finally:
        served.host.settings.delete("chat_rate_limit")


# -- a misconfigured site -----------------------------------------------------------------------

def store_raw(served: Served, key: str, text: str | None) -> None:
    """Write a setting's stored text around ``settings.set`` (as a hand edit would)."""
    with contextlib.closing(sqlite3.connect(served.folder / "site.db")) as conn, conn:
        if text is None:
            conn.execute("DELETE FROM settings WHERE key = ?", [key])
        else:
            conn.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) "
                         "VALUES (?, ?, 0)", [key, text])


@pytest.mark.parametrize(("key", "text"), [
    ("max_turns", "{oops"),  # not JSON
    ("max_turns", "0"),  # below every budget's minimum
    ("max_run_seconds", "NaN"),
    ("chat_tools", '["no_such_tool"]'),
])
def test_a_misconfigured_site_answers_503_naming_the_setting(served: Served, key: str,
                                                             text: str) -> None:
    token = served.token(f"misconfigured-{uuid.uuid4().hex[:8]}")
    store_raw(served, key, text)
    try:
        refused = served.post(token, {"message": "x"})
        body = error(served, refused, 503, "site_misconfigured")
        assert body["data"] == {"setting": key}
        assert "Retry-After" in refused.headers
    finally:
        store_raw(served, key, None)
    assert served.post(token, {"message": "x"}).status_code == 200  # fixed: served again


def test_serve_refuses_to_start_on_a_misconfigured_site(tmp_path: Any) -> None:
    db = tmp_path / "bad.db"
    done = subprocess.run(
        [sys.executable, "-m", "datamachine", "--db", str(db), "serve", "--port", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
             "DATAMACHINE_MAX_RUN_SECONDS": "NaN", "DATAMACHINE_LOAD_PLUGINS": ""})
    assert done.returncode == 1, done.stderr
    assert "max_run_seconds" in done.stderr
    assert "Traceback" not in done.stderr


# -- error bodies -------------------------------------------------------------------------------

def test_no_error_answer_names_a_server_path(served: Served) -> None:
    token = served.token("niaj")
    for response, status in (
        (served.post(None, {"message": "x"}), 401),
        (served.post(token, content=b"{not json"), 400),
        (served.post(token, {"message": 1}), 422),
        (served.post(token, {"message": "x", "session_id": "missing"}), 404),
        (httpx.get(f"{served.url}/nowhere"), 404),
    ):
        assert response.status_code == status, response.text
        assert_no_paths(served, response)
