"""The ``run_observer`` hook: one observer per run, that run's events only, and no cost for a
run nobody observes."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import RunInfo, hookimpl, tool


@tool
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: What to look up.
    """
    return f"found {query}"


class Recorder:
    """One run's observer: the run's info and its events, in order."""

    def __init__(self, run: RunInfo) -> None:
        self.run = run
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, payload: dict[str, Any]) -> None:
        self.events.append((name, payload))


class Observing:
    """A plugin that observes every run whose agent is not ``quiet``."""

    def __init__(self) -> None:
        self.observers: list[Recorder] = []

    @hookimpl
    def run_observer(self, run: RunInfo) -> Recorder | None:
        if run.agent_slug == "quiet":
            return None
        observer = Recorder(run)
        self.observers.append(observer)
        return observer


SCRIPT = [
    {"tool_calls": [{"id": "c1", "name": "lookup", "parameters": {"query": "x"}}]},
    {"content": "done"},
]


def test_each_run_gets_its_own_observer_with_its_info_and_events() -> None:
    plugin = Observing()
    host = bootstrap.boot(":memory:", plugins=[plugin], load_entrypoints=False)
    try:
        first = host.run_conversation([{"role": "user", "content": "go"}], [lookup], "scripted",
                                      "demo", mode="chat",
                                      payload={"script": SCRIPT, "agent_slug": "librarian"})
        host.run_conversation([{"role": "user", "content": "again"}], [], "scripted", "demo",
                              payload={"script": [{"content": "hi"}]})
    finally:
        host.close()
    one, two = plugin.observers
    assert one.run == RunInfo(provider="scripted", model="demo", mode="chat",
                              session_id=first.transcript_session_id, agent_slug="librarian",
                              continuation=False)
    assert [name for name, _ in one.events] == [
        "turn_started", "request_built", "tool_call", "tool_result",
        "turn_started", "request_built", "completed"]
    assert one.events[-1][1]["status"] == "completed"
    assert one.events[0][1]["agent_slug"] == "librarian"  # the base context, as a sink sees it
    assert [name for name, _ in two.events] == ["turn_started", "request_built", "completed"]
    assert two.run.agent_slug is None


def test_a_chat_turn_after_the_first_is_a_continuation_of_its_session() -> None:
    plugin = Observing()
    host = bootstrap.boot(":memory:", plugins=[plugin], load_entrypoints=False)
    try:
        session = host.chat_sessions.create().id
        for text in ("one", "two"):
            host.chat(session, text, provider="scripted", model="demo",
                      payload={"script": [{"content": "ok"}]})
    finally:
        host.close()
    assert [o.run.continuation for o in plugin.observers] == [False, True]
    assert {o.run.session_id for o in plugin.observers} == {session}


def test_an_unobserved_run_builds_no_event_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    from datamachine.conversation import conversation_run as run_module

    plugin = Observing()
    host = bootstrap.boot(":memory:", plugins=[plugin], load_entrypoints=False)
    made: list[bool] = []
    real = run_module.RunEvents

    def spy(*args: Any, **kwargs: Any) -> Any:
        emitter = real(*args, **kwargs)
        made.append(emitter.active)
        return emitter

    monkeypatch.setattr(run_module, "RunEvents", spy)
    try:
        result = host.run_conversation([{"role": "user", "content": "go"}], [], "scripted",
                                       "demo", payload={"script": [{"content": "hi"}],
                                                        "agent_slug": "quiet"})
    finally:
        host.close()
    assert result.status == "completed"
    assert made == [False]
    assert plugin.observers == []


class Broken:
    @hookimpl
    def run_observer(self, run: RunInfo) -> Any:
        raise RuntimeError("observer set-up failed")


def test_an_observer_plugin_that_raises_leaves_the_run_and_other_observers_alone(
        caplog: pytest.LogCaptureFixture) -> None:
    plugin = Observing()
    host = bootstrap.boot(":memory:", plugins=[plugin, Broken()], load_entrypoints=False)
    try:
        result = host.run_conversation([{"role": "user", "content": "go"}], [], "scripted",
                                       "demo", payload={"script": [{"content": "hi"}]})
    finally:
        host.close()
    assert result.status == "completed"
    assert plugin.observers[0].events[-1][0] == "completed"
    assert "run_observer" in caplog.text
