"""The budgets that count repeats in a run (DESIGN 22): ``provider_retries`` (counted at a
loopback server that always answers 503), ``completion_nudges`` (the nudges the model reads)
and ``output_retries`` (the re-asks for a structured answer). For each: the default, the clamp,
the setting, a per-run override (0 included: no repeat, and the flag even then), the flag and
snapshot in the result and the ``budget_exceeded`` event, and a plugin changing the clamp."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

import bootstrap
from datamachine import BudgetSpec, hookimpl
from datamachine.budgets_builtin import BUILTIN_BUDGETS
from datamachine.host import Host
from datamachine.providers.openai import OpenAIProvider
from tests.completion.helpers import USER, Events, save_note, say
from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply, completion


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as fake:
        yield fake


def _openai(host: Host, server: FakeOpenAIServer, **kwargs: Any) -> None:
    host.providers.register(OpenAIProvider(
        name="loopback", base_url=server.url + "/v1", api_key="sk-test", sleep=RecordingSleep(),
        jitter=lambda: 0.0, **kwargs))


def _overloaded(server: FakeOpenAIServer, times: int = 30) -> None:
    server.enqueue(*[Reply(503, {"error": {"message": "overloaded"}})] * times)


def _ask(host: Host, events: Events | None = None, **payload: Any) -> Any:
    if events is not None:
        payload["event_sink"] = events
    return host.run_conversation([{"role": "user", "content": "hello"}], None, "loopback",
                                 "gpt-test", mode="chat", payload=payload)


def _widened(name: str, **changes: Any) -> object:
    """A plugin that re-registers a built-in budget with another clamp once the host is up
    (a second claim in register_budgets() would be a boot error)."""
    spec = next(spec for spec in BUILTIN_BUDGETS if spec.name == name)

    class Widen:
        @hookimpl
        def host_started(self, host: Host) -> None:
            host.budgets.register(spec.model_copy(update=changes), owner="widen")

    return Widen()


# -- provider_retries ---------------------------------------------------------------------------
def test_a_request_is_retried_three_times_by_default_then_the_run_names_the_budget(
    host: Host, server: FakeOpenAIServer
) -> None:
    _openai(host, server)
    _overloaded(server)
    events = Events()
    result = _ask(host, events)
    assert len(server.requests) == 4  # the first request and three retries
    assert (result.status, result.budget) == ("error", "provider_retries")
    assert result.flags == ["max_provider_retries_reached"]
    assert result.error_code == "provider_http_error"
    assert "overloaded" in result.error
    assert result.warning.startswith("Maximum provider retries (3) reached.")
    snapshot = result.budgets["provider_retries"]
    assert (snapshot["current"], snapshot["ceiling"], snapshot["exceeded"]) == (3, 3, True)
    [spent] = events.named("budget_exceeded")
    assert (spent["budget"], spent["flag"], spent["current"]) == (
        "provider_retries", "max_provider_retries_reached", 3)


@pytest.mark.parametrize(("setting", "requests", "clamped"), [(1, 2, False), (0, 1, False),
                                                              (50, 11, True)])
def test_the_setting_sets_the_retries_and_is_clamped_to_ten(
    host: Host, server: FakeOpenAIServer, setting: int, requests: int, clamped: bool
) -> None:
    host.settings.set("provider_max_retries", setting)
    _openai(host, server)
    _overloaded(server)
    result = _ask(host)
    assert len(server.requests) == requests
    assert result.flags == ["max_provider_retries_reached"]
    assert result.budgets["provider_retries"]["ceiling"] == requests - 1
    clamp = [w for w in result.warnings if "provider_retries" in w]
    assert clamp == (["Budget 'provider_retries': requested ceiling 50 (from setting) is "
                      "outside its range [0, 10]; using 10."] if clamped else [])


def test_a_run_override_wins_over_the_setting_and_the_providers_own_count(
    host: Host, server: FakeOpenAIServer
) -> None:
    host.settings.set("provider_max_retries", 5)
    _openai(host, server, max_retries=4)
    _overloaded(server)
    result = _ask(host, budget_ceilings={"provider_retries": 0})
    assert len(server.requests) == 1  # no retry at all, and the stop still names the budget
    assert (result.budget, result.flags) == ("provider_retries", ["max_provider_retries_reached"])
    assert result.budgets["provider_retries"]["ceiling"] == 0
    assert "provider_retries budget is 0, so not retried" in result.error


def test_a_provider_built_with_its_own_count_keeps_it_over_the_setting(
    host: Host, server: FakeOpenAIServer
) -> None:
    host.settings.set("provider_max_retries", 5)
    _openai(host, server, max_retries=1)
    _overloaded(server)
    _ask(host)
    assert len(server.requests) == 2


def test_a_retry_that_succeeds_is_counted_but_stops_nothing(
    host: Host, server: FakeOpenAIServer
) -> None:
    _openai(host, server)
    server.enqueue(Reply(503, "busy"), Reply(503, "busy"), Reply(body=completion("hi")))
    result = _ask(host)
    assert (result.status, result.budget, result.flags) == ("completed", None, [])
    assert result.budgets["provider_retries"]["current"] == 2
    assert result.budgets["provider_retries"]["exceeded"] is False


def test_an_error_not_worth_retrying_is_not_a_budget_stop(
    host: Host, server: FakeOpenAIServer
) -> None:
    _openai(host, server)
    server.enqueue(Reply(400, {"error": {"message": "bad model"}}))
    result = _ask(host)
    assert (result.status, result.budget, result.flags) == ("error", None, [])
    assert len(server.requests) == 1
    assert "provider_retries" not in result.budgets


def test_a_plugin_changes_the_clamp_of_provider_retries(server: FakeOpenAIServer) -> None:
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False,
                        plugins=[_widened("provider_retries", max=12)]) as host:
        host.settings.set("provider_max_retries", 12)
        _openai(host, server)
        _overloaded(server)
        result = _ask(host)
    assert len(server.requests) == 13
    assert result.warnings == []


# -- completion_nudges --------------------------------------------------------------------------
def _never_done(host: Host, replies: int, events: Events | None = None,
                **payload: Any) -> Any:
    """A model that never calls the tool its task requires: every answer is nudged."""
    payload["script"] = [say(f"I will save it soon ({i}).") for i in range(replies)]
    payload["completion_assertions"] = {"required_tool_names": ["save_note"]}
    if events is not None:
        payload["event_sink"] = events
    return host.run_conversation(USER, [save_note], "scripted", "m", mode="chat",
                                 payload=payload)


def _nudges_read(result: Any) -> int:
    return sum(1 for m in result.messages
               if m.role == "user" and m.metadata.get("type") == "completion_nudge")


def test_five_nudges_by_default_then_the_run_is_incomplete_on_the_budget(host: Host) -> None:
    events = Events()
    result = _never_done(host, 10, events)
    assert (_nudges_read(result), result.completion_nudge_count) == (5, 5)
    assert result.turn_count == 6  # the first answer and one answer per nudge
    assert (result.status, result.budget) == ("incomplete", "completion_nudges")
    assert result.flags == ["max_completion_nudges_reached"]
    assert result.warning.startswith("Maximum completion nudges (5) reached.")
    snapshot = result.budgets["completion_nudges"]
    assert (snapshot["current"], snapshot["ceiling"], snapshot["exceeded"]) == (5, 5, True)
    assert [p["budget"] for p in events.named("budget_exceeded")] == ["completion_nudges"]


@pytest.mark.parametrize(("source", "ceiling", "nudges"), [
    ("setting", 2, 2), ("override", 0, 0), ("override", 1, 1), ("setting", 80, 50)])
def test_the_nudges_follow_the_setting_or_the_run_and_the_clamp(
    host: Host, source: str, ceiling: int, nudges: int
) -> None:
    payload: dict[str, Any] = {}
    if source == "setting":
        host.settings.set("max_completion_nudges", ceiling)
    else:
        payload["budget_ceilings"] = {"completion_nudges": ceiling}
    result = _never_done(host, 60, **payload)
    expected_turns = min(nudges + 1, 25)  # the turn budget (25) may end it first
    assert result.turn_count == expected_turns
    if nudges + 1 <= 25:
        assert _nudges_read(result) == nudges
        assert (result.status, result.flags) == ("incomplete",
                                                 ["max_completion_nudges_reached"])
    else:  # 50 nudges cannot fit in 25 turns: the turns run out first
        assert result.budget == "conversation_turns"
        assert result.budgets["completion_nudges"]["ceiling"] == 50
    clamp = [w for w in result.warnings if "completion_nudges" in w]
    assert bool(clamp) == (ceiling > 50)


def test_a_task_done_after_nudges_completes_and_shows_the_count(host: Host) -> None:
    from tests.completion.helpers import call, turn

    script = [say("Soon."), turn(call("save_note", text="n")), say("Filed.")]
    result = host.run_conversation(USER, [save_note], "scripted", "m", mode="chat", payload={
        "script": script, "completion_assertions": {"required_tool_names": ["save_note"]}})
    assert (result.status, result.budget, result.flags) == ("completed", None, [])
    assert result.budgets["completion_nudges"]["current"] == 1


def test_an_empty_answer_is_not_nudged_when_no_nudge_is_left(host: Host) -> None:
    from tests.completion.helpers import call, turn

    script = [turn(call("save_note", text="n")), say("")]
    result = host.run_conversation(USER, [save_note], "scripted", "m", mode="chat", payload={
        "script": script, "budget_ceilings": {"completion_nudges": 0}})
    assert result.turn_count == 2
    assert result.status == "incomplete"
    assert result.flags == ["empty_answer", "max_completion_nudges_reached"]
    assert result.budget == "completion_nudges"


def test_a_plugin_changes_the_clamp_of_completion_nudges() -> None:
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False,
                        plugins=[_widened("completion_nudges", max=1)]) as host:
        host.settings.set("max_completion_nudges", 3)
        result = _never_done(host, 10)
    assert _nudges_read(result) == 1
    assert any("completion_nudges" in w and "[0, 1]" in w for w in result.warnings)


# -- output_retries -----------------------------------------------------------------------------
class Answer(BaseModel):
    city: str


def _wrong_answers(host: Host, replies: int, **payload: Any) -> Any:
    payload["script"] = [say(f"not json {i}") for i in range(replies)]
    return host.run_conversation(USER, None, "scripted", "m", mode="chat", payload=payload,
                                 output_type=Answer)


def _reasks(result: Any) -> int:
    return sum(1 for m in result.messages
               if m.role == "user" and m.metadata.get("type") == "output_retry")


def test_three_reasks_by_default_then_the_run_is_incomplete_on_the_budget(host: Host) -> None:
    result = _wrong_answers(host, 10)
    assert (_reasks(result), result.turn_count) == (3, 4)
    assert (result.status, result.budget) == ("incomplete", "output_retries")
    assert result.flags == ["max_output_retries_reached"]
    assert "did not match output_type Answer" in result.warning
    assert result.output is None
    assert result.budgets["output_retries"]["current"] == 3


@pytest.mark.parametrize(("source", "ceiling", "reasks"), [
    ("setting", 1, 1), ("override", 0, 0), ("override", 2, 2), ("setting", 99, 20)])
def test_the_reasks_follow_the_setting_or_the_run_and_the_clamp(
    host: Host, source: str, ceiling: int, reasks: int
) -> None:
    payload: dict[str, Any] = {}
    if source == "setting":
        host.settings.set("max_output_retries", ceiling)
    else:
        payload["budget_ceilings"] = {"output_retries": ceiling}
    result = _wrong_answers(host, 30, **payload)
    if reasks + 1 <= 25:
        assert (_reasks(result), result.turn_count) == (reasks, reasks + 1)
        assert result.flags == ["max_output_retries_reached"]
    else:
        assert result.budgets["output_retries"]["ceiling"] == 20
    assert bool([w for w in result.warnings if "output_retries" in w]) == (ceiling > 20)


def test_a_valid_answer_after_a_reask_completes(host: Host) -> None:
    result = host.run_conversation(USER, None, "scripted", "m", mode="chat", payload={
        "script": [say("nope"), say('{"city": "Lyon"}')]}, output_type=Answer)
    assert (result.status, result.flags, result.output) == ("completed", [], Answer(city="Lyon"))
    assert result.budgets["output_retries"]["current"] == 1


def test_a_plugin_changes_the_clamp_of_output_retries() -> None:
    with bootstrap.boot(db_path=":memory:", load_entrypoints=False,
                        plugins=[_widened("output_retries", max=25)]) as host:
        result = _wrong_answers(host, 30, budget_ceilings={"output_retries": 22})
    assert result.budgets["output_retries"]["ceiling"] == 22
    assert result.warnings == []


def test_every_repeat_budget_is_listed_with_its_scope(host: Host) -> None:
    specs = {name: host.budgets.get_spec(name) for name in host.budgets.registered_names()}
    assert {name: (spec.scope, spec.min, spec.default, spec.max, spec.setting)
            for name, spec in specs.items() if spec is not None and name in (
                "provider_retries", "completion_nudges", "output_retries")} == {
        "provider_retries": ("request", 0, 3, 10, "provider_max_retries"),
        "completion_nudges": ("run", 0, 5, 50, "max_completion_nudges"),
        "output_retries": ("run", 0, 3, 20, "max_output_retries"),
    }
    assert isinstance(specs["provider_retries"], BudgetSpec)
