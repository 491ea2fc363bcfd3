"""A chat session's turn limit is the budget ``chat_turns`` (DESIGN.md 6 and 22).

Resolved once, by the host's budget registry, when the session is made (the caller's override,
else the setting ``chat_max_turns``, else 25; then the registered clamp, reported), and named
like every budget stop when it ends a run: ``budget``, the flag and a snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import BudgetSpec, ProviderRequest, hookimpl
from datamachine.conversation.chat import chat_turns_on
from datamachine.errors import DuplicateBudgetError, InvalidBudgetValue
from datamachine.host import Host
from tests.conversation.work import step
from tests.plugins import chat_turns_50

FLAG = "max_chat_turns_reached"


class Counting:
    """A model that counts the requests it gets; with ``work`` it calls ``step`` every turn
    (so one message runs until something stops it), else it answers at once."""

    def __init__(self, *, work: bool = False) -> None:
        self.work = work
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.requests.append(request)
        if self.work and request.tools:
            return {"content": "", "tool_calls": [
                {"name": "step", "parameters": {"n": len(self.requests)}}]}
        return {"content": f"answer {len(self.requests)}"}


class Confirm:
    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)

    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        return self.answers.pop(0) if self.answers else None


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


# -- resolved when the session is made ------------------------------------------------------

def test_a_new_session_takes_the_budget_s_default_of_25(host: Host) -> None:
    session = host.chat_sessions.create()
    assert (session.max_turns, session.warnings) == (25, [])
    resolved = host.budgets.resolve("chat_turns")
    assert (resolved.limit, resolved.source) == (25, "default")


def test_the_setting_chat_max_turns_gives_new_sessions_their_limit(host: Host) -> None:
    host.settings.set("chat_max_turns", 7)
    assert host.chat_sessions.create().max_turns == 7
    host.settings.set("chat_max_turns", "unlimited")
    assert host.chat_sessions.create().max_turns == "unlimited"


def test_a_session_s_own_max_turns_wins_over_the_setting(host: Host) -> None:
    host.settings.set("chat_max_turns", 7)
    assert host.chat_sessions.create(max_turns=3).max_turns == 3
    assert host.chat_sessions.create(max_turns="unlimited").max_turns == "unlimited"
    assert host.chat_sessions.create().max_turns == 7  # the others keep the setting's


def test_unlimited_is_taken_only_because_the_registered_budget_allows_it(host: Host) -> None:
    assert host.chat_sessions.create(max_turns="unlimited").max_turns == "unlimited"
    host.budgets.register(BudgetSpec(name="chat_turns", default=25, min=1, max=100,
                                     setting="chat_max_turns", scope="session"))
    with pytest.raises(InvalidBudgetValue, match="max_turns"):
        host.chat_sessions.create(max_turns="unlimited")
    with pytest.raises(InvalidBudgetValue, match="chat_max_turns"):
        host.settings.set("chat_max_turns", "unlimited")


def test_a_limit_outside_every_count_budget_is_refused_not_clamped(host: Host) -> None:
    for bad in (0, 10_001, "25"):
        with pytest.raises(InvalidBudgetValue, match="max_turns"):
            host.chat_sessions.create(max_turns=bad)  # type: ignore[arg-type]
    assert host.chat_sessions.list() == []


def test_a_plugin_that_narrows_the_clamp_changes_every_new_session_s_limit() -> None:
    with boot(chat_turns_50) as host:
        assert host.budgets.owner("chat_turns") == "tests.plugins.chat_turns_50"
        kept = host.chat_sessions.create(max_turns=40)
        assert (kept.max_turns, kept.warnings) == (40, [])
        clamped = host.chat_sessions.create(max_turns=60)
        assert clamped.max_turns == 50
        assert clamped.warnings == ["Budget 'chat_turns': requested ceiling 60 (from override) "
                                    "is outside its range [1, 50]; using 50."]
        assert host.chat_sessions.get(clamped.id).max_turns == 50  # what is stored
        assert host.chat_sessions.get(clamped.id).warnings == []  # reported once, not stored


def test_a_setting_above_the_plugin_s_clamp_is_clamped_and_reported() -> None:
    with boot(chat_turns_50) as host:
        host.settings.set("chat_max_turns", 60)  # a valid count: stored as written
        session = host.chat_sessions.create()
        assert session.max_turns == 50
        assert "60 (from setting)" in session.warnings[0]


def test_set_limit_goes_through_the_same_clamp() -> None:
    with boot(chat_turns_50) as host:
        session = host.chat_sessions.create(max_turns=5)
        changed = host.chat_sessions.set_limit(session.id, 60)
        assert changed.max_turns == 50
        assert "using 50" in changed.warnings[0]
        assert host.chat_sessions.set_limit(session.id, 40).warnings == []


def test_a_plugin_cannot_claim_chat_turns_through_register_budgets() -> None:
    # Two owners of one name stop the boot (DESIGN 4.2): a plugin overrides the built-in by
    # registering it again once the host is up (tests/plugins/chat_turns_50.py).
    class Claims:
        @hookimpl
        def register_budgets(self) -> list[BudgetSpec]:
            return [chat_turns_50.CHAT_TURNS_50]

    with pytest.raises(DuplicateBudgetError, match="'bootstrap' and"):
        boot(Claims())


def test_budget_ceilings_set_the_limit_of_a_session_a_run_makes() -> None:
    with boot(chat_turns_50) as host:
        host.settings.set("chat_max_turns", 10)
        made = chat_turns_on(host, "made-here", [{"role": "user", "content": "hi"}],
                             payload={"budget_ceilings": {"chat_turns": 60}}, create=True)
        assert made.status == "completed"
        assert host.chat_sessions.get("made-here").max_turns == 50
        assert any("requested ceiling 60" in w for w in made.warnings)
        plain = chat_turns_on(host, "from-setting", [{"role": "user", "content": "hi"}],
                              create=True)
        assert host.chat_sessions.get("from-setting").max_turns == 10
        assert plain.warnings == []


def test_budget_ceilings_on_an_existing_session_are_reported_and_not_applied(host: Host) -> None:
    session = host.chat_sessions.create(max_turns=4)
    result = host.chat(session.id, "hi", payload={"budget_ceilings": {"chat_turns": 9}})
    assert result.status == "completed"
    assert host.chat_sessions.get(session.id).max_turns == 4
    assert any("keeps its limit (4)" in w for w in result.warnings)


# -- what the limit allows, and how its stop is named ---------------------------------------

def test_a_session_allows_exactly_its_limit_of_provider_turns_in_one_run() -> None:
    model = Counting(work=True)
    with boot(model) as host:
        session = host.chat_sessions.create(max_turns=3)
        result = host.chat(session.id, "work", tools=[step])
        stored = host.transcripts.get_transcript(session.id)
    assert len(model.requests) == 3  # no fourth request, and no summary call
    assert (result.status, result.turn_count, result.completed) == ("aborted", 3, False)
    assert result.budget == "chat_turns"
    assert result.flags == [FLAG]
    assert result.max_turns_reached is False  # that one is conversation_turns'
    assert result.budgets["chat_turns"] == {"current": 3, "ceiling": 3, "remaining": 0,
                                            "exceeded": True, "hard_ceiling": None,
                                            "rail": "ceiling"}
    # Stored as returned.
    assert stored.status == "aborted"
    assert (stored.result["budget"], stored.result["flags"]) == ("chat_turns", [FLAG])
    assert stored.budgets["chat_turns"]["current"] == 3


def test_a_session_allows_exactly_its_limit_of_turns_across_messages() -> None:
    model = Counting()
    with boot(model) as host:
        session = host.chat_sessions.create(max_turns=3)
        answers = [host.chat(session.id, text) for text in ("one", "two", "three")]
    assert [a.status for a in answers] == ["completed", "completed", "aborted"]
    assert len(model.requests) == 3
    assert [a.flags for a in answers] == [[], [], [FLAG]]
    assert "chat_turns" not in answers[0].budgets  # only the run it stopped shows it
    assert answers[2].final_content == "answer 3"  # the answer at the limit is kept


def test_unlimited_counts_without_ever_stopping() -> None:
    model = Counting()
    with boot(model) as host:
        session = host.chat_sessions.create(max_turns="unlimited")
        answers = [host.chat(session.id, str(i)) for i in range(30)]
        assert host.chat_sessions.get(session.id).turn_count == 30
    assert {a.status for a in answers} == {"completed"}
    assert all(a.flags == [] for a in answers)


def test_a_confirmed_limit_is_no_stop() -> None:
    model = Counting()
    with boot(model, Confirm(True)) as host:
        session = host.chat_sessions.create(max_turns=1)
        result = host.chat(session.id, "hi")
    assert (result.status, result.budget, result.flags) == ("completed", None, [])
    assert "chat_turns" not in result.budgets


def test_declined_before_the_run_names_the_budget_too() -> None:
    model = Counting()
    with boot(model, Confirm(False)) as host:
        session = host.chat_sessions.create(max_turns=2)
        host.chat_sessions.add_turns(session.id, 2)  # at its limit before the run
        result = host.chat(session.id, "hi")
        stored = host.transcripts.get_transcript(session.id) if host.transcripts.exists(
            session.id) else None
    assert model.requests == []
    assert (result.status, result.budget, result.flags) == ("aborted", "chat_turns", [FLAG])
    assert result.budgets["chat_turns"]["current"] == 2
    assert result.budgets["chat_turns"]["ceiling"] == 2
    assert stored is None  # nothing ran, nothing stored


def test_a_declined_pause_at_the_limit_names_the_budget() -> None:
    with boot() as host:
        host.settings.set("confirmation", "pause")
        session = host.chat_sessions.create(max_turns=1)
        assert host.chat(session.id, "one").status == "completed"
        paused = host.chat(session.id, "two")
        assert (paused.status, paused.budget) == ("awaiting_confirmation", "chat_turns")
        assert paused.flags == []  # not stopped yet: waiting
        declined = host.resume(session.id, approve=False)
        stored = host.transcripts.get_transcript(session.id)
    assert (declined.status, declined.budget, declined.flags) == ("aborted", "chat_turns",
                                                                  [FLAG])
    assert declined.budgets["chat_turns"]["exceeded"] is True
    assert (stored.result["budget"], stored.result["flags"]) == ("chat_turns", [FLAG])

