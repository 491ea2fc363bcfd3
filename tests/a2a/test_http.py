"""One real server: auth, caller headers, body limits and validation, statuses, sessions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from datamachine import BudgetSpec
from datamachine.server.chain import (
    HEADER_CALLER_AGENT,
    HEADER_CALLER_SITE,
    HEADER_CHAIN_DEPTH,
    HEADER_CHAIN_ID,
    HEADER_CHAIN_SITES,
)
from tests.a2a.conftest import MakeSite
from tests.a2a.live import Site

TIMEOUT = 30.0


def post(site: Site, body: Any = None, *, headers: dict[str, str] | None = None,
         auth: bool = True, content: Any = None) -> httpx.Response:
    sent = {**(site.auth() if auth else {}), **(headers or {})}
    if content is not None:
        return httpx.post(f"{site.url}/chat", content=content, headers=sent, timeout=TIMEOUT)
    return httpx.post(f"{site.url}/chat", json=body, headers=sent, timeout=TIMEOUT)


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "data"}
    assert body["code"] == code
    assert body["message"]
    return body


@pytest.fixture
def site(make_site: MakeSite) -> Site:
    return make_site("solo", fail_on="please fail")


def test_health_reports_the_stored_site_id(site: Site) -> None:
    response = httpx.get(f"{site.url}/health", timeout=TIMEOUT)
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "site_id": site.host.settings.get("site_id")}


def test_chat_runs_a_chat_mode_conversation_and_returns_the_result(site: Site) -> None:
    response = post(site, {"message": "hello"})
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "completed"
    assert result["completed"] is True
    assert result["final_content"] == "solo answers: hello"
    assert result["mode"] == "chat"
    assert result["provider"] == "scripted"
    assert response.headers[HEADER_CHAIN_DEPTH] == "1"
    assert len(response.headers[HEADER_CHAIN_ID]) == 32  # generated: uuid4 hex
    [request] = site.model.requests
    assert request.payload["caller_context"]["chain_depth"] == 1


def test_messages_list_is_accepted(site: Site) -> None:
    response = post(site, {"messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "hi"}]})
    assert response.status_code == 200
    assert response.json()["final_content"] == "solo answers: hi"


def test_caller_headers_reach_the_run(site: Site) -> None:
    token = site.host.tokens.create("from-up", site="up")  # a token made for the site "up"
    headers = {HEADER_CHAIN_ID: "chain.42", HEADER_CHAIN_DEPTH: "1", HEADER_CALLER_SITE: "up",
               HEADER_CALLER_AGENT: "planner", HEADER_CHAIN_SITES: "root, up",
               "Authorization": f"Bearer {token}"}
    response = post(site, {"message": "hi"}, headers=headers, auth=False)
    assert response.status_code == 200
    assert response.headers[HEADER_CHAIN_ID] == "chain.42"
    assert response.headers[HEADER_CHAIN_DEPTH] == "2"
    assert site.model.requests[0].payload["caller_context"] == {
        "chain_id": "chain.42", "chain_depth": 2, "chain_sites": ["root", "up"],
        "caller_site": "up", "caller_agent": "planner"}


BAD_AUTHORIZATION = [None, "Bearer dm_not-a-real-token", "Basic dXNlcjpwYXNz", "Bearer",
                     "Bearer dm_"]


def test_missing_or_wrong_token_is_401(site: Site) -> None:
    for value in BAD_AUTHORIZATION:  # one server for the whole table: startup is the cost
        headers = {} if value is None else {"Authorization": value}
        body = assert_error(post(site, {"message": "x"}, headers=headers, auth=False), 401,
                            "datamachine_unauthorized")
        assert "Bearer" in body["message"], value
    assert site.model.requests == []


def test_revoked_token_stops_working_on_the_next_request(site: Site) -> None:
    token = site.host.tokens.create("temporary")
    headers = {"Authorization": f"Bearer {token}"}
    assert post(site, {"message": "x"}, headers=headers, auth=False).status_code == 200
    assert site.host.tokens.revoke("temporary")
    assert_error(post(site, {"message": "x"}, headers=headers, auth=False), 401,
                 "datamachine_unauthorized")


def test_auth_is_checked_before_headers_and_body(site: Site) -> None:
    response = post(site, content=b"{not json", auth=False,
                    headers={HEADER_CHAIN_DEPTH: "nope"})
    assert_error(response, 401, "datamachine_unauthorized")


MALFORMED_HEADERS = [
    (HEADER_CHAIN_DEPTH, "two"),
    (HEADER_CHAIN_DEPTH, "-1"),
    (HEADER_CHAIN_DEPTH, "1.5"),
    (HEADER_CHAIN_DEPTH, ""),
    (HEADER_CHAIN_DEPTH, "1001"),
    (HEADER_CHAIN_DEPTH, "99999999999999999999"),
    (HEADER_CHAIN_ID, "has space"),
    (HEADER_CHAIN_ID, "x" * 129),
    (HEADER_CHAIN_ID, "-leading-dash"),
    (HEADER_CALLER_SITE, "a,b"),
    (HEADER_CALLER_AGENT, "bad agent"),
    (HEADER_CHAIN_SITES, "a,,b"),
    (HEADER_CHAIN_SITES, "a,b c"),
    (HEADER_CHAIN_SITES, ",".join(f"s{i}" for i in range(101))),
]


def test_malformed_caller_header_is_400_naming_it(site: Site) -> None:
    for header, value in MALFORMED_HEADERS:
        body = assert_error(post(site, {"message": "x"}, headers={header: value}), 400,
                            "invalid_header")
        assert body["data"] == {"header": header}, (header, value)
        assert header in body["message"], (header, value)
    assert site.model.requests == []
    assert site.transcript_count() == 0


def test_caller_header_sent_twice_is_400(site: Site) -> None:
    headers = [("Authorization", f"Bearer {site.token}"), (HEADER_CHAIN_DEPTH, "0"),
               (HEADER_CHAIN_DEPTH, "2")]
    response = httpx.post(f"{site.url}/chat", json={"message": "x"}, headers=headers,
                          timeout=TIMEOUT)
    body = assert_error(response, 400, "invalid_header")
    assert body["data"] == {"header": HEADER_CHAIN_DEPTH}


def test_depth_refusal_has_retry_after_and_runs_nothing(site: Site) -> None:
    response = post(site, {"message": "x"}, headers={HEADER_CHAIN_DEPTH: "2",
                                                     HEADER_CHAIN_ID: "c-1"})
    body = assert_error(response, 429, "datamachine_chain_depth_exceeded")
    assert body["data"] == {"chain_id": "c-1", "chain_depth": 3, "ceiling": 3,
                            "retry_after": 60}
    assert response.headers["Retry-After"] == "60"
    assert site.model.requests == []
    assert site.transcript_count() == 0
    assert site.host.chat_sessions.list() == []


def test_depth_below_the_ceiling_is_accepted(site: Site) -> None:
    for depth in ("0", "1"):
        assert post(site, {"message": "x"}, headers={HEADER_CHAIN_DEPTH: depth}
                    ).status_code == 200


def test_body_over_max_request_bytes_is_413(site: Site) -> None:
    site.host.settings.set("max_request_bytes", 1024)
    body = assert_error(post(site, {"message": "x" * 4000}), 413, "request_too_large")
    assert body["data"] == {"max_request_bytes": 1024}
    assert post(site, {"message": "x" * 900}).status_code == 200


def test_default_limit_is_one_mebibyte(site: Site) -> None:
    envelope = len(b'{"message":""}')
    over = post(site, content=b'{"message":"' + b"x" * (1_048_577 - envelope) + b'"}')
    assert_error(over, 413, "request_too_large")
    assert site.model.requests == []
    at_limit = post(site, content=b'{"message":"' + b"x" * (1_048_576 - envelope) + b'"}')
    assert at_limit.status_code == 200


def test_chunked_body_is_cut_off_past_the_limit(site: Site) -> None:
    site.host.settings.set("max_request_bytes", 1024)

    def chunks() -> Iterator[bytes]:
        yield b'{"message": "'
        for _ in range(16):  # 4 KiB in all, no Content-Length
            yield b"y" * 256
        yield b'"}'

    response = post(site, content=chunks())
    assert_error(response, 413, "request_too_large")
    [hit] = site.server.app.chat_hits()
    assert hit.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in hit.headers
    assert site.model.requests == []


def test_invalid_content_length_is_400(site: Site) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", site.server.port), timeout=TIMEOUT) as conn:
        conn.sendall(b"POST /chat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + site.token.encode() + b"\r\nContent-Length: 12abc\r\n\r\n{}")
        reply = conn.recv(4096)
    # h11 refuses a non-numeric Content-Length before the app sees it: a 400 either way.
    assert reply.startswith(b"HTTP/1.1 400")


MALFORMED_BODIES = [
    (b"{not json", 400, "invalid_json"),
    (b"", 400, "invalid_json"),
    (b'["message", "hi"]', 422, "invalid_request"),
    (b'{"message": "hi", "messages": [{"role": "user", "content": "hi"}]}', 422,
     "invalid_request"),
    (b"{}", 422, "invalid_request"),
]


def test_malformed_body_gets_a_json_error(site: Site) -> None:
    for content, status, code in MALFORMED_BODIES:
        assert_error(post(site, content=content), status, code)
    assert site.model.requests == []


INVALID_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"message": "x", "max_turns": 0}, "max_turns"),
    ({"message": "x", "max_turns": 10_001}, "max_turns"),
    ({"message": "x", "max_turns": "10"}, "max_turns"),
    ({"message": "x", "max_turns": True}, "max_turns"),
    ({"message": "x", "max_turns": 2.5}, "max_turns"),
    ({"message": "x", "max_turn": 3}, "max_turn"),
    ({"message": ""}, "message"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"message": "x", "mode": "Not A Mode"}, "mode"),
    ({"message": "x", "session_id": "bad id"}, "session_id"),
    ({"message": 5}, "message"),
]


def test_invalid_field_is_422_naming_it(site: Site) -> None:
    for body, field in INVALID_FIELDS:
        error = assert_error(post(site, body), 422, "invalid_request")
        assert field in [e["field"] for e in error["data"]["errors"]], (body, error)
        assert f"{field}:" in error["message"], (body, error)
    assert site.model.requests == []


def test_max_turns_above_the_clamp_is_accepted_clamped_and_reported(site: Site) -> None:
    response = post(site, {"message": "x", "max_turns": 500})
    assert response.status_code == 200
    result = response.json()
    assert result["budgets"]["conversation_turns"]["ceiling"] == 200
    assert any("500" in w and "200" in w for w in result["warnings"])


def test_unknown_provider_is_422_and_stores_nothing(site: Site) -> None:
    body = assert_error(post(site, {"message": "x", "provider": "nonesuch"}), 422,
                        "invalid_request")
    assert "nonesuch" in body["message"]
    assert site.transcript_count() == 0
    assert site.host.chat_sessions.list() == []


def test_provider_failure_is_502_with_the_result(site: Site) -> None:
    body = assert_error(post(site, {"message": "please fail"}), 502, "provider_error")
    assert body["data"]["status"] == "error"
    assert body["data"]["error_code"] == "provider_http_error"
    assert "the model is down" in body["message"]


def test_budget_exceeded_is_200(make_site: MakeSite) -> None:
    looping = make_site("loop", next_site="loop")  # calls itself: refused as a cycle
    token = looping.host.tokens.create("self", site=looping.site_id)
    looping.host.settings.set("remote_sites", {"loop": {"url": looping.url, "token": token}})
    response = post(looping, {"message": "x", "max_turns": 1})
    assert response.status_code == 200
    result = response.json()
    assert result["status"] == "budget_exceeded"
    assert result["budget"] == "conversation_turns"
    assert [h.status for h in looping.server.app.chat_hits()] == [409, 200]


def test_wrong_method_and_unknown_path_answer_json(site: Site) -> None:
    assert_error(httpx.get(f"{site.url}/chat", timeout=TIMEOUT), 405, "method_not_allowed")
    assert_error(httpx.get(f"{site.url}/nowhere", timeout=TIMEOUT), 404, "not_found")


# -- sessions ---------------------------------------------------------------------------------

def test_session_id_continues_the_stored_conversation(site: Site) -> None:
    first = post(site, {"message": "one"}).json()
    session_id = first["transcript_session_id"]
    second = post(site, {"message": "two", "session_id": session_id})
    assert second.status_code == 200
    result = second.json()
    assert result["transcript_session_id"] == session_id
    assert [m["content"] for m in result["messages"]] == [
        "one", "solo answers: one", "two", "solo answers: two"]
    # The model saw the whole session, and the session counts both runs' turns.
    assert [m["content"] for m in site.model.requests[-1].messages] == [
        "one", "solo answers: one", "two"]
    assert site.host.chat_sessions.get(session_id).turn_count == 2
    assert len(site.host.transcripts.get(session_id)) == 4
    assert (result["turn_count"], result["cumulative_turn_count"]) == (1, 2)


def test_unknown_session_is_404(site: Site) -> None:
    assert_error(post(site, {"message": "x", "session_id": "no-such-session"}), 404,
                 "session_not_found")
    assert site.transcript_count() == 0


def test_aborted_session_is_409(site: Site) -> None:
    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    site.host.chat_sessions.abort(session_id)
    asked = len(site.model.requests)
    assert_error(post(site, {"message": "two", "session_id": session_id}), 409,
                 "session_aborted")
    assert len(site.model.requests) == asked


def test_busy_session_is_409_lock_contention_without_running(site: Site) -> None:
    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    asked = len(site.model.requests)
    token = site.host.transcripts.acquire(session_id, 60)  # another request is running
    assert token is not None
    try:
        body = assert_error(post(site, {"message": "two", "session_id": session_id}), 409,
                            "session_lock_contention")
    finally:
        site.host.transcripts.release(session_id, token)
    assert body["data"]["status"] == "transcript_lock_contention"
    assert body["data"]["transcript_session_id"] == session_id
    assert len(site.model.requests) == asked
    assert len(site.host.transcripts.get(session_id)) == 2
    # Once the other request is done, the session continues.
    assert post(site, {"message": "two", "session_id": session_id}).status_code == 200


def test_second_concurrent_request_on_a_session_is_409_while_the_first_runs(site: Site) -> None:
    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    site.model.hold = threading.Event()
    first: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: first.append(
        post(site, {"message": "two", "session_id": session_id})))
    worker.start()
    try:
        assert site.model.entered.wait(10.0), "the first request never reached the model"
        asked = len(site.model.requests)
        second = post(site, {"message": "three", "session_id": session_id})
        assert_error(second, 409, "session_lock_contention")
        assert len(site.model.requests) == asked  # the second request ran nothing
    finally:
        site.model.hold.set()
        worker.join(30.0)
    assert not worker.is_alive()
    assert first[0].status_code == 200
    assert [m["content"] for m in site.host.transcripts.get(session_id)] == [
        "one", "solo answers: one", "two", "solo answers: two"]


def test_session_turn_limit_is_enforced_over_http(site: Site) -> None:
    # Nobody can confirm over HTTP: the run that reaches the limit aborts the session (409).
    site.host.settings.set("chat_max_turns", 2)
    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    assert site.host.chat_sessions.get(session_id).turn_count == 1
    reached = post(site, {"message": "two", "session_id": session_id})
    body = assert_error(reached, 409, "session_aborted")
    assert body["data"]["status"] == "aborted"
    # Named as every budget stop is: the budget, its flag and its snapshot.
    assert body["data"]["budget"] == "chat_turns"
    assert body["data"]["flags"] == ["max_chat_turns_reached"]
    assert body["data"]["budgets"]["chat_turns"]["current"] == 2
    assert body["data"]["budgets"]["chat_turns"]["ceiling"] == 2
    assert site.host.chat_sessions.get(session_id).status == "aborted"
    assert_error(post(site, {"message": "three", "session_id": session_id}), 409,
                 "session_aborted")


def test_a_session_opened_over_http_takes_the_registered_clamp_and_says_so(site: Site) -> None:
    # A plugin narrowed chat_turns to [1, 50]; the site's setting asks for 60.
    site.host.budgets.register(BudgetSpec(name="chat_turns", default=25, min=1, max=50,
                                          setting="chat_max_turns", scope="session",
                                          unlimited=True))
    site.host.settings.set("chat_max_turns", 60)
    response = post(site, {"message": "one"})
    assert response.status_code == 200, response.text
    result = response.json()
    assert site.host.chat_sessions.get(result["transcript_session_id"]).max_turns == 50
    assert ("Budget 'chat_turns': requested ceiling 60 (from setting) is outside its range "
            "[1, 50]; using 50.") in result["warnings"]
    # The request's max_turns is the run's turn ceiling, never the session's limit.
    again = post(site, {"message": "two", "max_turns": 3,
                        "session_id": result["transcript_session_id"]}).json()
    assert again["budgets"]["conversation_turns"]["ceiling"] == 3
    assert site.host.chat_sessions.get(result["transcript_session_id"]).max_turns == 50


def test_a_paused_session_is_200_awaiting_and_resume_continues_it(site: Site) -> None:
    site.host.settings.set("chat_max_turns", 1)
    first = post(site, {"message": "one", "confirmation": "pause"}).json()
    assert first["status"] == "completed"  # a final answer at the limit ends as usual
    session_id = first["transcript_session_id"]
    asked = len(site.model.requests)
    paused = post(site, {"message": "two", "session_id": session_id, "confirmation": "pause"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert (body["status"], body["completed"]) == ("awaiting_confirmation", False)
    assert body["pending"]["kind"] == "chat_turn_limit"
    assert len(site.model.requests) == asked  # it waits before asking the model
    refused = assert_error(post(site, {"message": "three", "session_id": session_id}), 409,
                           "session_awaiting_confirmation")
    assert refused["data"]["pending"]["kind"] == "chat_turn_limit"

    resumed = post(site, {"session_id": session_id, "resume": {"approve": True}})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["final_content"] == "solo answers: two"
    assert_error(post(site, {"session_id": session_id, "resume": {"approve": True}}), 409,
                 "session_not_paused")


def test_a_declined_resume_over_http_aborts_the_session(site: Site) -> None:
    site.host.settings.set("chat_max_turns", 1)
    site.host.settings.set("confirmation", "pause")
    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    assert post(site, {"message": "two", "session_id": session_id}).json()["status"] == (
        "awaiting_confirmation")
    declined = post(site, {"session_id": session_id, "resume": {"approve": False}})
    body = assert_error(declined, 409, "session_aborted")
    assert (body["data"]["budget"], body["data"]["flags"]) == ("chat_turns",
                                                               ["max_chat_turns_reached"])
    assert site.host.chat_sessions.get(session_id).status == "aborted"


@pytest.mark.parametrize(("body", "field"), [
    ({"resume": {"approve": True}}, "session_id"),
    ({"session_id": "s", "message": "x", "resume": {"approve": True}}, "exactly one"),
    ({"session_id": "s", "resume": {"approve": "yes"}}, "resume.approve"),
    ({"session_id": "s", "resume": {"approve": True, "extend_by": 0}}, "extend_by"),
    ({"message": "x", "confirmation": "later"}, "confirmation")])
def test_bad_resume_bodies_are_422_naming_the_field(site: Site, body: dict[str, Any],
                                                    field: str) -> None:
    answer = assert_error(post(site, body), 422, "invalid_request")
    assert field in answer["message"]


def test_resuming_an_unknown_session_is_404(site: Site) -> None:
    assert_error(post(site, {"session_id": "nope", "resume": {"approve": True}}), 404,
                 "session_not_found")


def test_chat_resume_answers_chat_sessions_only(site: Site) -> None:
    site.model.next_site = "elsewhere"  # the model calls a tool: one turn spends the budget
    paused = site.host.run_conversation(
        [{"role": "user", "content": "go"}], provider="scripted", max_turns=1,
        payload={"confirmation": "pause"})
    assert paused.status == "awaiting_confirmation"
    assert_error(post(site, {"session_id": paused.transcript_session_id,
                             "resume": {"approve": True}}), 404, "session_not_found")
    assert site.host.transcripts.summary(str(paused.transcript_session_id)).status == (
        "awaiting_confirmation")


def test_a_spent_window_is_429_with_retry_after_until_the_window_resets(site: Site) -> None:
    from freezegun import freeze_time

    from datamachine.storage import WindowKey

    site.host.settings.set("spend_limits", [
        {"name": "daily_tokens", "budget": "total_tokens", "window": "day", "limit": 1000,
         "scope": "token"}])
    # The server's clock is the test's: frozen one minute before midnight UTC (ticking).
    with freeze_time("2026-11-24T23:59:00Z", tick=True) as frozen:
        site.host.spend.settle("earlier-runs", [
            (WindowKey("daily_tokens", "peer", "2026-11-24T00:00:00Z"), 1000)])
        refused = post(site, {"message": "hello"})
        body = assert_error(refused, 429, "spend_limit_reached")
        assert 58 <= int(refused.headers["retry-after"]) <= 60
        assert body["data"]["limit"] == "daily_tokens"
        assert body["data"]["used"] == 1000
        assert site.model.requests == []  # refused before any provider call
        frozen.move_to("2026-11-25T00:00:01Z")
        accepted = post(site, {"message": "hello"})
        assert accepted.status_code == 200, accepted.text
        # The new window holds this run's own spend only.
        assert 0 < accepted.json()["budgets"]["daily_tokens"]["current"] < 1000
    assert len(site.model.requests) == 1


def test_a_window_too_full_for_the_first_request_is_a_200_budget_stop(site: Site) -> None:
    from agents_api import clock
    from datamachine.conversation.spending import window_bounds
    from datamachine.storage import WindowKey

    site.host.settings.set("spend_limits", [
        {"name": "hourly_tokens", "budget": "total_tokens", "window": "hour", "limit": 1000}])
    start, _ = window_bounds("hour", clock.now())
    site.host.spend.settle("earlier", [(WindowKey("hourly_tokens", "site", start), 999)])
    # Not spent (999 of 1,000), so not refused up front; the run stops on the window before
    # its first request, like any budget stop.
    response = post(site, {"message": "hello"})
    assert response.status_code == 200, response.text
    result = response.json()
    assert (result["status"], result["budget"], result["turn_count"]) == (
        "budget_exceeded", "hourly_tokens", 0)
    assert "would pass the hourly tokens budget" in result["warning"]
    assert site.model.requests == []


def test_a_mode_no_plugin_declared_is_refused_before_anything_runs(site: Site) -> None:
    # A well-formed mode nobody declared used to run as if it were chat.
    body = assert_error(post(site, {"message": "hi", "mode": "nope"}), 422, "invalid_request")
    assert "'nope' is not a known mode" in body["message"]
    assert body["data"]["errors"] == [{"field": "mode", "message": body["message"]}]
    assert site.model.requests == []
    assert site.host.transcripts.list() == []


def test_a_provider_no_plugin_registered_is_422_naming_the_field(site: Site) -> None:
    body = assert_error(post(site, {"message": "hi", "provider": "bogus"}), 422,
                        "invalid_request")
    assert body["data"]["errors"] == [{"field": "provider", "message": body["message"]}]
    assert site.model.requests == []


def test_a_chat_message_to_a_session_a_run_died_on_settles_the_call_in_doubt_first(
        site: Site) -> None:
    """DESIGN.md 24 over /chat: the session's last run stored a write call's intent and died
    before its result; the next message pauses in doubt before the model is asked."""
    from datamachine.storage.tool_intents import Intent

    session_id = post(site, {"message": "one"}).json()["transcript_session_id"]
    store = site.host.transcripts
    token = store.acquire(session_id, 60)
    assert token is not None
    writer = store.open_writer(session_id, token, 60)
    writer.record_intent(Intent("c9", "send", {"to": "ada"}, "dm-k9", "write", 2))
    writer.release()  # the run died here; its lock would have run out
    asked = len(site.model.requests)
    paused = post(site, {"message": "two", "session_id": session_id, "confirmation": "pause"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert body["status"] == "awaiting_confirmation"
    assert body["pending"]["kind"] == "tool_in_doubt"
    assert body["pending"]["tool_call"] == {"id": "c9", "name": "send",
                                            "parameters": {"to": "ada"}}
    assert len(site.model.requests) == asked  # the model is not asked while it is in doubt
    assert_error(post(site, {"message": "three", "session_id": session_id}), 409,
                 "session_awaiting_confirmation")
    declined = post(site, {"session_id": session_id, "resume": {"approve": False}})
    assert declined.status_code == 200, declined.text
    told = [m["payload"] for m in declined.json()["messages"] if m["type"] == "tool_result"]
    assert told[-1]["error_type"] == "tool_not_done"
    assert store.unsettled_intents(session_id) == []
