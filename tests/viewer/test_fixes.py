"""The run viewer's edges: logs of a served process, odd ids, damaged rows, a resume that
loses a race, proxies, sign-out after a revoke, and multi-run sessions on the timeline."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from datamachine.server.ui import present
from tests.a2a.test_cli import _serve, invoke
from tests.exactly_once.crash_tools import LEDGER
from tests.viewer.site import DELETED, ViewerSite, csrf_of, doubt_run, logged_in


def test_a_served_viewer_logs_logins_and_answers(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    token = invoke(db, "tokens", "create", "alice", "--viewer")[1].strip().splitlines()[-1]
    process, url = _serve(db, log_level="info")
    try:
        with httpx.Client(base_url=url, follow_redirects=True, timeout=30) as client:
            page = client.get("/ui/login")
            assert client.post("/ui/login", data={"token": token, "csrf": csrf_of(page.text)}
                               ).status_code == 200
            assert client.get("/ui/").status_code == 200
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0]
    assert f"Run viewer: {url}/ui/ (log in with a token" in output
    assert "INFO:     datamachine: run viewer login by token 'alice'" in output


def test_ids_with_slashes_and_dots_open_and_resume(site: ViewerSite) -> None:
    for odd in ("team/a", ".."):
        site.host.transcripts.begin(odd, [{"role": "user", "content": f"odd {odd}"}])
    client = logged_in(site)
    listed = client.get("/ui/").text
    for odd in ("team/a", ".."):
        href = re.search(rf'href="(/ui/run\?id=[^"]+)">odd {re.escape(odd)}<', listed)
        assert href is not None
        assert client.get(href.group(1).replace("&amp;", "&")).status_code == 200


def test_a_damaged_row_is_a_line_saying_so_not_a_failed_list(site: ViewerSite) -> None:
    site.host.handle.conn.execute(
        "UPDATE transcripts SET budgets = ? WHERE id = 'weather-run'",
        ['{"cost": {"current": NaN, "ceiling": 1}, "turns": {"current": 1e999, "ceiling": 2}}'])
    site.host.handle.conn.execute(
        "UPDATE transcripts SET result = ? WHERE id = 'paused-run'",
        ['{"status": "awaiting_confirmation", "pending": {"kind": "tool_approval", '
         '"tool_call": "not a dict"}}'])
    site.host.handle.conn.commit()
    client = logged_in(site)
    page = client.get("/ui/")
    assert page.status_code == 200
    assert 'data-id="weather-run"' in page.text
    assert client.get("/ui/run?id=paused-run").status_code == 200
    assert client.get("/ui/run?id=weather-run").status_code == 200


def test_a_resume_that_loses_the_race_says_so(site: ViewerSite) -> None:
    client = logged_in(site)
    csrf = csrf_of(client.get("/ui/run?id=paused-run").text)
    held = site.host.transcripts.acquire("paused-run", 60)  # someone else is answering
    assert held is not None
    answer = client.post("/ui/resume", data={"id": "paused-run", "answer": "approve",
                                             "csrf": csrf})
    assert answer.status_code == 409
    assert "nothing was done" in answer.text
    site.host.transcripts.release("paused-run", held)
    assert site.host.transcripts.summary("paused-run").status == "awaiting_confirmation"
    assert DELETED == []


def test_the_open_viewer_refuses_requests_through_a_proxy(open_site: ViewerSite) -> None:
    client = open_site.client()
    for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
        answer = client.get("/ui/", headers={header: "127.0.0.1"})
        assert answer.status_code == 403
        assert "through a proxy" in answer.text


def test_the_public_origin_setting_admits_a_proxys_forms(site: ViewerSite) -> None:
    client = logged_in(site)
    csrf = csrf_of(client.get("/ui/").text)
    proxied = {"Origin": "https://runs.example.com"}
    assert client.post("/ui/logout", data={"csrf": csrf}, headers=proxied).status_code == 403
    site.host.settings.set("viewer_origin", "https://runs.example.com")
    assert client.post("/ui/logout", data={"csrf": csrf}, headers=proxied).status_code == 303


def test_a_revoked_session_can_still_sign_out(site: ViewerSite) -> None:
    client = logged_in(site)
    csrf = csrf_of(client.get("/ui/").text)
    site.host.tokens.revoke("alice")
    login = client.get("/ui/login")
    assert "signed in as" not in login.text
    assert client.post("/ui/logout", data={"csrf": csrf}).status_code == 303


def test_a_chat_token_at_the_login_is_told_what_it_is(site: ViewerSite) -> None:
    chat = site.host.tokens.create("peer")
    client = site.client()
    page = client.get("/ui/login")
    answer = client.post("/ui/login", data={"token": chat, "csrf": csrf_of(page.text)})
    assert answer.status_code == 401
    assert "That is a /chat token" in answer.text


def _envelope(role: str, text: str, kind: str = "") -> dict[str, object]:
    return {"type": "text", "role": role, "content": text,
            "metadata": {"type": kind} if kind else {}}


def test_each_run_of_a_session_gets_its_own_marks_and_the_stop_precedes_the_summary() -> None:
    numbered: list[tuple[int | None, int, dict[str, object]]] = [
        (0, 0, _envelope("user", "first")), (0, 1, _envelope("assistant", "a")),
        (0, 2, _envelope("assistant", "b")),
        (0, 2, _envelope("assistant", "sum", "final_summary")),
        (2, 0, _envelope("user", "second")), (2, 1, _envelope("assistant", "c")),
        (3, 1, _envelope("assistant", "x")),  # a resumed run: its turn 1, as the last one's
    ]
    marks = [
        {"event": "budget_pressure", "turn": 2, "run_base": 0, "tier": "warning"},
        {"event": "budget_exceeded", "turn": 2, "run_base": 0},
        {"event": "budget_pressure", "turn": 1, "run_base": 2, "tier": "caution"},
        {"event": "final_summary", "turn": 0, "run_base": 4},  # a run with no messages
        {"event": ["not", "a", "name"], "turn": 1, "run_base": 3},  # damaged: still shown
    ]
    groups = present.timeline(numbered, marks)
    shape = [(g.run, g.turn, [i.kind if i.kind != "message" else i.text for i in g.items])
             for g in groups]
    assert shape == [
        (1, 0, ["first"]), (1, 1, ["a"]), (1, 2, ["mark", "b", "mark", "sum"]),
        (2, 0, ["second"]), (2, 1, ["mark", "c"]),
        (3, 1, ["mark", "x"]),
        (4, 0, ["mark"]),
    ]
    assert [g.opens_run for g in groups] == [False, False, False, True, False, True, True]
    # Cut messages: a run past them is not on the page, so neither are its events.
    cut = present.timeline(numbered[:3], marks, complete=False)
    assert [(g.run, g.turn) for g in cut] == [(1, 0), (1, 1), (1, 2)]


def test_old_messages_without_a_run_are_grouped_by_their_turns() -> None:
    numbered: list[tuple[int | None, int, dict[str, object]]] = [
        (None, 0, _envelope("user", "a")), (None, 1, _envelope("assistant", "b")),
        (None, 0, _envelope("user", "c")), (None, 1, _envelope("assistant", "d")),
    ]
    groups = present.timeline(numbered, [])
    assert [(g.run, g.turn, g.opens_run) for g in groups] == [
        (1, 0, False), (1, 1, False), (2, 0, True), (2, 1, False)]


def test_a_pause_with_tools_the_site_lacks_says_so_instead_of_offering_buttons(
        site: ViewerSite) -> None:
    from tests.viewer.site import WIPE_DISK

    result = site.host.run_conversation(
        [{"role": "user", "content": "Wipe the disk."}], [WIPE_DISK], "scripted", "stand-in",
        payload={"transcript_session_id": "wipe-run", "confirmation": "pause"})
    assert result.status == "awaiting_confirmation"
    from datamachine.conversation.pausing import paused_runs

    paused_runs(site.host).forget("wipe-run")  # as if another process had run it
    client = logged_in(site)
    page = client.get("/ui/run?id=wipe-run").text
    assert "cannot answer it" in page
    assert "wipe_disk" in page
    assert 'class="approve"' not in page
    answer = client.post("/ui/resume", data={"id": "wipe-run", "answer": "decline",
                                             "csrf": csrf_of(page)})
    assert answer.status_code == 409
    assert 'href="/ui/run?id=wipe-run">Back to the run' in answer.text
    paused = client.get("/ui/run?id=paused-run").text
    assert "resume(session_id" not in paused  # the warning for programs is not shown
    assert 'class="approve"' in paused


def test_a_stale_answer_never_answers_the_next_question(site: ViewerSite) -> None:
    from datamachine.errors import SessionNotPaused

    client = logged_in(site)
    stale = client.get("/ui/run?id=research-run")  # not paused: no form, so make a pause
    assert 'class="approve"' not in stale.text
    paused = site.host.run_conversation(
        [{"role": "user", "content": "Research the history of tea."}], [], "scripted",
        "stand-in", max_turns=1,
        payload={"transcript_session_id": "tea", "confirmation": "pause"})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    first_pause = paused.pending["pause_id"]
    page = client.get("/ui/run?id=tea").text
    assert f'name="pause" value="{first_pause}"' in page
    # Someone else approves; the run pauses again with a new question.
    again = site.host.resume("tea", True, extend_by=1, pause_id=first_pause)
    assert again.status == "awaiting_confirmation"
    assert again.pending is not None
    assert again.pending["pause_id"] != first_pause
    answer = client.post("/ui/resume", data={"id": "tea", "answer": "approve",
                                             "pause": first_pause, "csrf": csrf_of(page)})
    assert answer.status_code == 409
    assert "paused again with a new question" in answer.text
    assert site.host.transcripts.summary("tea").result["pending"]["pause_id"] == (
        again.pending["pause_id"])
    with pytest.raises(SessionNotPaused, match="answered and paused again"):
        site.host.resume("tea", True, pause_id=first_pause)


def test_viewer_origin_is_compared_as_browsers_send_origins(site: ViewerSite) -> None:
    client = logged_in(site)
    csrf = csrf_of(client.get("/ui/").text)
    site.host.settings.set("viewer_origin", "https://Runs.Example.com:443/")
    answer = client.post("/ui/logout", data={"csrf": csrf},
                         headers={"Origin": "https://runs.example.com"})
    assert answer.status_code == 303
    assert "secure" in answer.headers["set-cookie"].lower()


def test_run_it_again_answers_a_call_in_doubt_and_a_late_record_is_refused(
        site: ViewerSite) -> None:
    session = doubt_run(site.host)
    client = logged_in(site)
    page = client.get(f"/ui/run?id={session}").text
    pause = re.search(r'name="pause" value="([^"]+)"', page)
    call = re.search(r'name="call" value="([^"]+)"', page)
    assert pause is not None
    assert call is not None
    answer = client.post("/ui/resume", data={"id": session, "answer": "approve",
                                             "pause": pause.group(1), "csrf": csrf_of(page)})
    assert answer.status_code == 303
    assert len(LEDGER) == 2  # a person said run it again
    assert site.host.transcripts.summary(session).status == "completed"
    late = client.post("/ui/resolve", data={"id": session, "call": call.group(1),
                                            "result": "sent", "csrf": csrf_of(page)})
    assert late.status_code == 409
    assert "not in doubt any more" in late.text
    assert len(LEDGER) == 2
