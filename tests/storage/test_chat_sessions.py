"""Chat sessions: the storage rules of DESIGN.md section 6."""

from __future__ import annotations

import pytest

from agents_api import Message
from datamachine.errors import (
    ChatSessionExists,
    ChatSessionNotFound,
    InvalidBudgetValue,
    SessionAborted,
)
from datamachine.host import Host


def test_a_new_session_is_active_at_zero_with_the_default_limit_of_25(host: Host) -> None:
    session = host.chat_sessions.create()
    assert (session.turn_count, session.status, session.max_turns) == (0, "active", 25)
    assert host.chat_sessions.get(session.id) == session


def test_the_default_limit_comes_from_the_chat_max_turns_setting(host: Host) -> None:
    host.settings.set("chat_max_turns", 7)
    assert host.chat_sessions.create().max_turns == 7
    host.settings.set("chat_max_turns", "unlimited")
    assert host.chat_sessions.create().max_turns == "unlimited"
    # A bad value is refused when it is written, not at the next create().
    with pytest.raises(InvalidBudgetValue, match="chat_max_turns"):
        host.settings.set("chat_max_turns", "lots")
    assert host.settings.get("chat_max_turns") == "unlimited"


def test_a_bad_chat_max_turns_from_the_environment_fails_at_create(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMACHINE_CHAT_MAX_TURNS", "lots")
    with pytest.raises(InvalidBudgetValue, match="chat_max_turns"):
        host.chat_sessions.create()


def test_environment_overrides_the_chat_max_turns_setting(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATAMACHINE_CHAT_MAX_TURNS", "4")
    assert host.chat_sessions.create().max_turns == 4


@pytest.mark.parametrize("bad", [0, -1, 10_001, "10", 2.5, True, None, "Unlimited"])
def test_invalid_limits_are_refused_with_the_knob_named(host: Host, bad: object) -> None:
    session = host.chat_sessions.create(max_turns=3)
    with pytest.raises(InvalidBudgetValue, match="max_turns"):
        host.chat_sessions.set_limit(session.id, bad)  # type: ignore[arg-type]
    if bad is not None:
        with pytest.raises(InvalidBudgetValue, match="max_turns"):
            host.chat_sessions.create(max_turns=bad)  # type: ignore[arg-type]
    assert host.chat_sessions.get(session.id).max_turns == 3


def test_turns_count_up_to_the_limit_and_a_confirmation_resets_them(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=3)
    assert host.chat_sessions.add_turns(session.id, 2).limit_reached is False
    reached = host.chat_sessions.add_turns(session.id)
    assert reached.turn_count == 3
    assert reached.limit_reached is True
    reset = host.chat_sessions.reset_turns(session.id)
    assert (reset.turn_count, reset.status, reset.limit_reached) == (0, "active", False)


def test_unlimited_still_counts_but_never_reaches_a_limit(host: Host) -> None:
    session = host.chat_sessions.create(max_turns="unlimited")
    counted = host.chat_sessions.add_turns(session.id, 500)
    assert counted.turn_count == 500
    assert counted.limit_reached is False


def test_switching_from_unlimited_to_an_integer_resets_the_count(host: Host) -> None:
    session = host.chat_sessions.create(max_turns="unlimited")
    host.chat_sessions.add_turns(session.id, 40)
    limited = host.chat_sessions.set_limit(session.id, 10)
    assert (limited.max_turns, limited.turn_count) == (10, 0)


def test_changing_an_integer_limit_keeps_the_count(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=10)
    host.chat_sessions.add_turns(session.id, 4)
    assert host.chat_sessions.set_limit(session.id, 3).turn_count == 4
    assert host.chat_sessions.set_limit(session.id, "unlimited").turn_count == 4


def test_an_aborted_session_is_terminal_and_refuses_new_turns(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=1)
    host.chat_sessions.add_turns(session.id)
    aborted = host.chat_sessions.abort(session.id)
    assert aborted.status == "aborted"
    assert aborted.aborted
    with pytest.raises(SessionAborted, match=session.id):
        host.chat_sessions.require_active(session.id)
    with pytest.raises(SessionAborted):
        host.chat_sessions.add_turns(session.id)
    with pytest.raises(SessionAborted):
        host.chat_sessions.reset_turns(session.id)
    assert host.chat_sessions.abort(session.id).status == "aborted"
    assert host.chat_sessions.get(session.id).turn_count == 1


def test_a_chosen_session_id_is_used_once(host: Host) -> None:
    assert host.chat_sessions.create(session_id="support-42").id == "support-42"
    with pytest.raises(ChatSessionExists, match="support-42"):
        host.chat_sessions.create(session_id="support-42")


def test_missing_sessions_are_clear_errors(host: Host) -> None:
    for call in (host.chat_sessions.get, host.chat_sessions.abort,
                 host.chat_sessions.reset_turns, host.chat_sessions.messages):
        with pytest.raises(ChatSessionNotFound, match="'ghost'"):
            call("ghost")


def test_a_sessions_messages_live_in_the_transcript_with_its_id(host: Host) -> None:
    session = host.chat_sessions.create()
    assert host.chat_sessions.messages(session.id) == []
    host.transcripts.append_turn(session.id, 1, [Message.text("assistant", "hello")])
    assert [m["content"] for m in host.chat_sessions.messages(session.id)] == ["hello"]
    assert [s.id for s in host.chat_sessions.list()] == [session.id]
