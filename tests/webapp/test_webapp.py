"""The web-app pattern of docs/human-in-the-loop.md: a run pauses in one HTTP request and a
person's answer resumes it in a later one (async endpoints, nothing blocks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

import bootstrap
from tests.webapp.app import RuleModel, create_app, make_tools


@pytest.fixture
def app() -> Iterator[tuple[TestClient, list[str], Any]]:
    deleted: list[str] = []
    with bootstrap.boot(":memory:", plugins=[RuleModel()], load_entrypoints=False) as host, \
            TestClient(create_app(host, make_tools(deleted))) as client:
        yield client, deleted, host


def test_a_tool_needing_approval_waits_and_runs_exactly_once_when_approved(
        app: tuple[TestClient, list[str], Any]) -> None:
    client, deleted, _ = app
    asked = client.post("/chat", json={"message": "delete old.log"}).json()
    assert asked["status"] == "awaiting_confirmation"
    assert asked["question"] == "Allow delete_file({'path': 'old.log'})?"
    assert deleted == []
    # The person answers in a second request; the same session goes on.
    done = client.post("/answer", json={"session_id": asked["session_id"], "approve": True})
    assert done.json() == {"session_id": asked["session_id"], "status": "completed",
                           "answer": "Done: deleted old.log"}
    assert deleted == ["old.log"]
    again = client.post("/answer", json={"session_id": asked["session_id"], "approve": True})
    assert again.status_code == 409
    assert deleted == ["old.log"]


def test_a_declined_tool_never_runs(app: tuple[TestClient, list[str], Any]) -> None:
    client, deleted, _ = app
    asked = client.post("/chat", json={"message": "delete old.log"}).json()
    done = client.post("/answer", json={"session_id": asked["session_id"], "approve": False})
    assert done.json()["status"] == "completed"
    assert "was not run" in done.json()["answer"]
    assert deleted == []


def test_a_chat_at_its_turn_limit_asks_to_continue_in_a_later_request(
        app: tuple[TestClient, list[str], Any]) -> None:
    client, _, host = app
    host.settings.set("chat_max_turns", 2)
    asked = client.post("/chat", json={"message": "research owls"}).json()
    assert asked["status"] == "awaiting_confirmation"
    assert asked["question"] == "This conversation reached its turn limit. Continue?"
    session_id = asked["session_id"]
    busy = client.post("/chat", json={"session_id": session_id, "message": "hello?"})
    assert busy.status_code == 409
    done = client.post("/answer", json={"session_id": session_id, "approve": True}).json()
    assert (done["status"], done["answer"]) == ("completed", "Done: notes on owls, part 3")
    # One transcript: three lookups across the two requests, then the answer.
    stored = host.transcripts.get(session_id)
    assert [m["type"] for m in stored].count("tool_result") == 3
    assert host.chat_sessions.get(session_id).status == "active"
    # The two turns after the reset used the limit up again: the next message waits first.
    follow_up = client.post("/chat", json={"session_id": session_id, "message": "thanks"})
    assert follow_up.json()["status"] == "awaiting_confirmation"
    done = client.post("/answer", json={"session_id": session_id, "approve": True}).json()
    assert done["answer"] == "You said: thanks"
