"""A chat session's turn limit is the budget ``chat_turns`` (DESIGN.md 6 and 22).

Resolved once, by the host's budget registry, when the session is made (the caller's override,
else the setting ``chat_max_turns``, else 25; then the registered clamp, reported).
"""

from __future__ import annotations

import pytest

import bootstrap
from datamachine import BudgetSpec, hookimpl
from datamachine.conversation.chat import chat_turns_on
from datamachine.errors import DuplicateBudgetError, InvalidBudgetValue
from datamachine.host import Host
from tests.plugins import chat_turns_50


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
