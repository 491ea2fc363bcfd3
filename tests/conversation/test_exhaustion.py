"""Graceful exhaustion, soft ceilings under hard rails, and the wall clock that interrupts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.conversation.ending import strip_thinking
from datamachine.host import Host
from tests.conversation.work import USER, step


class Model:
    """Calls ``step`` every turn; answers summary requests with ``summaries`` in order."""

    def __init__(self, summaries: list[Any] | None = None, answer_on: int | None = None) -> None:
        self.summaries = list(summaries or [])
        self.answer_on = answer_on
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.requests.append(request)
        if request.messages[-1]["content"].startswith("[BUDGET EXHAUSTED]"):
            return self.summaries.pop(0) if self.summaries else {"content": ""}
        if self.answer_on is not None and request.turn >= self.answer_on:
            return {"content": "final answer"}
        return {"content": "", "tool_calls": [{"name": "step", "parameters": {"n": request.turn}}]}


class Confirm:
    def __init__(self, answers: list[bool | None]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int, str]] = []

    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        self.asked.append((budget.name(), budget.ceiling(), context["kind"]))
        return self.answers.pop(0) if self.answers else None


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def run(host: Host, max_turns: int = 3, **payload: Any) -> tuple[Any, list[tuple[str, Any]]]:
    events: list[tuple[str, Any]] = []
    result = host.run_conversation(USER, [step], "scripted", "m", max_turns=max_turns,
                                   payload={"event_sink": lambda e, p: events.append((e, p)),
                                            **payload})
    return result, events


def test_summary_call_has_no_tools_is_told_the_tool_count_and_is_not_a_turn() -> None:
    model = Model([{"content": "<think>hmm</think> Did 3 steps, 0 left undone."}])
    with boot(model) as host:
        result, events = run(host, 3)
    summary_request = model.requests[-1]
    assert summary_request.tools == []
    assert "3 tool call(s) ran" in summary_request.messages[-1]["content"]
    assert result.final_content == "Did 3 steps, 0 left undone."
    assert result.turn_count == 3
    assert result.status == "budget_exceeded"
    assert "max_conversation_turns_reached" in result.flags
    assert result.warning is not None
    assert result.messages[-1].metadata == {"type": "final_summary"}
    summary_events = [p for e, p in events if e == "final_summary"]
    assert summary_events[0]["source"] == "model"
    assert [e for e, _ in events].index("final_summary") < [e for e, _ in events].index(
        "completed")


def test_empty_summary_is_retried_once_then_falls_back_to_a_sentence_naming_the_budget() -> None:
    model = Model([{"content": "<think>only thinking</think>"}, {"content": "second try"}])
    with boot(model) as host:
        result, _ = run(host, 2)
    assert result.final_content == "second try"

    model = Model([{"content": ""}, {"content": "   "}])
    with boot(model) as host:
        result, events = run(host, 2)
    assert "conversation turns budget was used up (2/2)" in result.final_content
    assert [p["source"] for e, p in events if e == "final_summary"] == ["fallback"]
    assert len([r for r in model.requests if not r.tools]) == 2


def test_failing_summary_call_falls_back() -> None:
    model = Model([RuntimeError("provider down")])
    with boot(model) as host:
        result, events = run(host, 2)
    assert result.final_content.startswith("The run stopped because its conversation turns")
    assert [p.get("error") for e, p in events if e == "final_summary"] == ["provider down"]


@pytest.mark.parametrize("budget_setting", [("max_tool_calls", 2), ("max_turns", 2)])
def test_every_budget_exhaustion_path_ends_with_non_empty_final_content(
    budget_setting: tuple[str, int]
) -> None:
    model = Model()  # never gives a summary
    with boot(model) as host:
        host.settings.set(*budget_setting)
        result = host.run_conversation(USER, [step], "scripted", "m")
    assert result.status == "budget_exceeded"
    assert result.final_content


def test_no_summary_call_when_the_model_already_answered() -> None:
    model = Model(answer_on=3)
    with boot(model) as host:
        result, events = run(host, 3)
    assert result.status == "completed"
    assert not any(e == "final_summary" for e, _ in events)


def test_final_summary_false_skips_the_call_but_keeps_the_reason() -> None:
    model = Model(["never used"])
    with boot(model) as host:
        result, _ = run(host, 2, final_summary=False)
    assert all(r.tools for r in model.requests)
    assert result.final_content == ""
    assert result.status == "budget_exceeded"
    assert result.warning == "Maximum conversation turns (2) reached. Response may be incomplete."


def test_strip_thinking_handles_unclosed_blocks() -> None:
    assert strip_thinking("<think>a</think>b<think>c") == "b"
    assert strip_thinking("plain") == "plain"


def test_extension_granted_resumes_the_same_run_with_full_context() -> None:
    confirm = Confirm([True, False])
    model = Model([{"content": "sum"}])
    with boot(model, confirm) as host:
        result, events = run(host, 2)
    assert confirm.asked == [("conversation_turns", 2, "budget_exhausted"),
                             ("conversation_turns", 4, "budget_exhausted")]
    assert result.turn_count == 4
    assert [p["ceiling"] for e, p in events if e == "budget_extended"] == [4]
    # The third request still carries turn 1's and 2's tool results.
    assert len([m for m in model.requests[2].messages if m["role"] == "tool"]) == 2
    assert result.final_content == "sum"


def test_extension_refused_or_headless_stops_with_summary() -> None:
    for plugins in ([Confirm([False])], []):
        model = Model([{"content": "stopped"}])
        with boot(model, *plugins) as host:
            result, _ = run(host, 2)
        assert (result.turn_count, result.final_content) == (2, "stopped")


def test_extension_never_passes_the_hard_ceiling() -> None:
    confirm = Confirm([True] * 10)
    with boot(Model(), confirm) as host:
        host.budgets.register("conversation_turns", {"default": 2, "min": 1, "max": 5})
        result, _ = run(host, 2, extend_by=2)
    # 2 -> 4 -> 5 (hard ceiling): never asked once the hard rail is what is spent.
    assert result.turn_count == 5
    assert len(confirm.asked) == 2
    assert result.budgets["conversation_turns"]["rail"] == "hard_ceiling"


def test_extension_not_offered_when_the_wall_clock_is_spent() -> None:
    confirm = Confirm([True] * 5)
    from freezegun import freeze_time

    with freeze_time("2026-01-01") as frozen:
        class Slow(Model):
            @hookimpl
            def text_result(self, request: ProviderRequest) -> Any:
                frozen.tick(2)  # every provider call takes two seconds
                return super().text_result(request)

        with boot(Slow([{"content": "done"}]), confirm) as host:
            result, _ = run(host, 50, max_seconds=3)
    assert result.budget == "wall_clock_seconds"
    assert confirm.asked == []
    assert result.final_content == "done"


def test_hung_provider_is_cut_by_the_wall_clock_and_still_answers() -> None:
    class Hung:
        name = "hung"

        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, request: ProviderRequest) -> Any:
            self.calls += 1
            if request.tools and self.calls > 1:
                await asyncio.sleep(30)  # never answers in time
            if not request.tools:
                return {"content": "partial summary"}
            return {"content": "", "tool_calls": [{"name": "step", "parameters": {"n": 1}}]}

    provider = Hung()

    class Plugin:
        @hookimpl
        def register_providers(self) -> list[Any]:
            return [provider]

    with boot(Plugin()) as host:
        result = host.run_conversation(USER, [step], "hung", "m",
                                       payload={"max_seconds": 1})
    assert result.status == "budget_exceeded"
    assert result.budget == "wall_clock_seconds"
    assert result.final_content == "partial summary"
    assert len(result.tool_execution_results) == 1


class Repeater:
    """Calls ``step`` with n=1 every turn (duplicates after the first), and once with
    arguments that do not decode; records the summary request."""

    def __init__(self) -> None:
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.requests.append(request)
        if request.messages[-1]["content"].startswith("[BUDGET EXHAUSTED]"):
            return {"content": "One step done."}
        parameters: Any = '{"n": ' if request.turn == 2 else {"n": 1}
        return {"content": "", "tool_calls": [{"name": "step", "parameters": parameters}]}


def test_summary_counts_only_the_calls_that_ran() -> None:
    model = Repeater()
    with boot(model) as host:
        result, events = run(host, 5)
    assert result.status == "budget_exceeded"
    prompt = model.requests[-1].messages[-1]["content"]
    assert "1 tool call(s) ran" in prompt
    assert [p["tool_calls"] for e, p in events if e == "final_summary"] == [1]
    assert result.budgets["tool_calls"]["current"] == 5


# -- wall_clock_seconds is a registered budget (DESIGN 22) ------------------------------------
class _TwoSecondTurns(Model):
    """Every provider call takes two seconds of frozen time."""

    def __init__(self, frozen: Any) -> None:
        super().__init__([{"content": "done"}])
        self.frozen = frozen

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.frozen.tick(2)
        return super().text_result(request)


@pytest.mark.parametrize(("source", "value", "ceiling", "turns", "clamped"), [
    ("setting", 5, 5, 3, False),        # 2 s, 4 s, 6 s: the third turn passes 5 s
    ("budget_ceilings", 3, 3, 2, False),
    ("max_seconds", 3.5, 4, 2, False),  # fractions kept by the rail, rounded up in the ceiling
    ("setting", 100_000, 86_400, 50, True),
])
def test_the_wall_clock_budget_resolves_like_every_budget(
    source: str, value: float, ceiling: int, turns: int, clamped: bool
) -> None:
    from freezegun import freeze_time

    with freeze_time("2026-01-01") as frozen, boot(_TwoSecondTurns(frozen)) as host:
        payload: dict[str, Any] = {}
        if source == "setting":
            host.settings.set("max_run_seconds", value)
        elif source == "budget_ceilings":
            payload["budget_ceilings"] = {"wall_clock_seconds": value}
        else:
            payload["max_seconds"] = value
        result, events = run(host, 50, **payload)
    snapshot = result.budgets["wall_clock_seconds"]
    assert snapshot["ceiling"] == ceiling
    assert result.turn_count == turns
    if turns < 50:
        assert (result.status, result.budget) == ("budget_exceeded", "wall_clock_seconds")
        assert result.flags == ["max_wall_clock_seconds_reached"]
        spent = [p for e, p in events if e == "budget_exceeded"]
        assert spent[0]["flag"] == "max_wall_clock_seconds_reached"
    else:
        assert result.budget == "conversation_turns"
    clamp = [w for w in result.warnings if "wall_clock_seconds" in w]
    assert clamp == ([f"Budget 'wall_clock_seconds': requested ceiling {value} (from setting) "
                      "is outside its range [1, 86400]; using 86400."] if clamped else [])


def test_an_unset_wall_clock_is_no_budget_at_all() -> None:
    with boot(Model(answer_on=2)) as host:
        result, _ = run(host, 5)
        assert host.budgets.resolve("wall_clock_seconds").limit is None
    assert "wall_clock_seconds" not in result.budgets


def test_a_plugin_changes_the_clamp_of_the_wall_clock() -> None:
    from freezegun import freeze_time

    class Longer:
        @hookimpl
        def host_started(self, host: Host) -> None:
            spec = host.budgets.get_spec("wall_clock_seconds")
            assert spec is not None
            host.budgets.register(spec.model_copy(update={"max": 172_800}), owner="longer")

    with freeze_time("2026-01-01") as frozen, boot(_TwoSecondTurns(frozen), Longer()) as host:
        host.settings.set("max_run_seconds", 100_000)
        result, _ = run(host, 3)
    assert result.budgets["wall_clock_seconds"]["ceiling"] == 100_000
    assert result.warnings == []
