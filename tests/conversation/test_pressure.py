"""Budget pressure: tiers at the exact turns, one-shot events, transcripts untouched."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.conversation.pressure import default_tier
from datamachine.host import Host
from tests.conversation.work import USER, step


class Model:
    """Calls ``step`` every turn (new parameters each time) and records what it was sent."""

    def __init__(self, answer_on: int | None = None, text: bool = False) -> None:
        self.answer_on = answer_on
        self.text = text
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        self.requests.append(request)
        if not request.tools and request.turn > 1 and request.messages[-1]["content"].startswith(
            "[BUDGET EXHAUSTED]"
        ):
            return {"content": "summary"}
        if self.answer_on is not None and request.turn >= self.answer_on:
            return {"content": "final answer"}
        return {"content": "working" if self.text else "",
                "tool_calls": [{"name": "step", "parameters": {"n": request.turn}}]}


def notices(request: ProviderRequest) -> list[str]:
    return [m["content"] for m in request.messages
            if isinstance(m.get("content"), str) and m["content"].startswith("[BUDGET")]


class Run:
    def __init__(self, result: Any, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.result = result
        self.events = events
        self.messages = result.messages


def run(model: Model, ceiling: int, pressure: Any = True, **extra: Any) -> tuple[Host, Run]:
    host = bootstrap.boot(":memory:", plugins=[model], load_entrypoints=False)
    events: list[tuple[str, dict[str, Any]]] = []
    payload = {"budget_pressure": pressure, "event_sink": lambda e, p: events.append((e, p)),
               **extra}
    result = host.run_conversation(USER, [step], "scripted", "m", payload=payload,
                                   max_turns=ceiling)
    return host, Run(result, events)


@pytest.mark.parametrize(("ceiling", "caution", "warning"),
                         [(5, 3, 4), (10, 7, 9), (20, 14, 18), (60, 42, 54)])
def test_default_tiers_fire_at_the_documented_turns(ceiling: int, caution: int,
                                                    warning: int) -> None:
    tiers = [default_tier(k, ceiling) for k in range(1, ceiling + 1)]
    assert tiers.index("caution") + 1 == caution
    assert tiers.index("warning") + 1 == warning
    assert all(t is None for t in tiers[: caution - 1])

    model = Model()
    host, _ = run(model, ceiling)
    turn_requests = [r for r in model.requests if r.tools]
    for request in turn_requests:
        expected = default_tier(request.turn, ceiling)
        texts = [t for t in notices(request) if "turn" in t]
        if expected is None:
            assert texts == [], request.turn
        elif expected == "caution":
            assert texts == [f"[BUDGET: turn {request.turn}/{ceiling}. "
                             f"{ceiling - request.turn} left. Start consolidating your work.]"]
        else:
            assert texts[0].startswith(f"[BUDGET WARNING: turn {request.turn}/{ceiling}.")
    host.close()


def test_default_texts_match_the_design_examples() -> None:
    model = Model()
    host, _ = run(model, 10)
    by_turn = {r.turn: notices(r) for r in model.requests if r.tools}
    assert "[BUDGET: turn 7/10. 3 left. Start consolidating your work.]" in by_turn[7]
    assert ("[BUDGET WARNING: turn 9/10. 1 left. Give your final answer now; call a tool only "
            "if it is essential.]") in by_turn[9]
    host.close()


def test_budget_pressure_event_fires_once_per_tier() -> None:
    host, result = run(Model(), 10)
    fired = [(p["budget"], p["tier"], p["current"], p["ceiling"])
             for e, p in result.events if e == "budget_pressure"]
    assert fired == [("conversation_turns", "caution", 7, 10),
                     ("conversation_turns", "warning", 9, 10)]
    host.close()


def test_transcript_and_result_messages_are_byte_identical_with_and_without_pressure() -> None:
    host_on, with_pressure = run(Model(), 10, True, transcript_session_id="s")
    host_off, without = run(Model(), 10, False, transcript_session_id="s")
    dumped_on = [m.model_dump_json() for m in with_pressure.messages]
    dumped_off = [m.model_dump_json() for m in without.messages]
    assert dumped_on == dumped_off
    assert host_on.transcripts.get("s") == host_off.transcripts.get("s")
    assert not any("[BUDGET" in str(m["content"]) for m in host_on.transcripts.get("s"))
    host_on.close()
    host_off.close()


def test_pressure_is_off_by_default_and_the_setting_switches_it_on() -> None:
    model = Model()
    host, _ = run(model, 5, None)
    assert not any(notices(r) for r in model.requests if r.tools)
    host.close()
    model = Model()
    host = bootstrap.boot(":memory:", plugins=[model], load_entrypoints=False)
    host.settings.set("budget_pressure", True)
    host.run_conversation(USER, [step], "scripted", "m", max_turns=5)
    assert any(notices(r) for r in model.requests if r.tools)
    host.close()


def test_custom_tiers_role_and_other_budgets() -> None:
    model = Model()
    pressure = {"tool_calls": {"tiers": [{"at": 0.5, "message": "half of {ceiling} {budget}"},
                                         {"at": 0.75, "message": "3/4 used: {remaining} left"}],
                               "role": "system"}}
    host = bootstrap.boot(":memory:", plugins=[model], load_entrypoints=False)
    host.settings.set("max_tool_calls", 8)
    events: list[tuple[str, dict[str, Any]]] = []
    host.run_conversation(USER, [step], "scripted", "m", max_turns=20,
                          payload={"budget_pressure": pressure,
                                   "event_sink": lambda e, p: events.append((e, p))})
    sent = {r.turn: [m for m in r.messages if m["role"] == "system"] for r in model.requests}
    assert sent[3] == []
    assert sent[4] == [{"role": "system", "content": "half of 8 tool_calls"}]
    assert sent[6] == [{"role": "system", "content": "3/4 used: 2 left"}]
    assert [p["tier"] for e, p in events if e == "budget_pressure"] == ["tier_1", "tier_2"]
    host.close()


def test_wrap_up_offers_only_allowed_tools_and_escalates_once() -> None:
    model = Model()
    pressure: dict[str, Any] = {"conversation_turns": {"wrap_up": {"allowed_tools": []}}}
    host, result = run(model, 10, pressure)
    tools_by_turn = {r.turn: [t["name"] for t in r.tools] for r in model.requests}
    assert tools_by_turn[8] == ["step"]
    assert tools_by_turn[9] == []
    # The model ignored the warning on turn 9 (tool calls, no text): turn 10 escalates once.
    assert notices(model.requests[9])[0].startswith("[BUDGET FINAL WARNING: turn 10/10.")
    tiers = [p["tier"] for e, p in result.events if e == "budget_pressure"]
    assert tiers == ["caution", "warning", "final_warning"]
    host.close()


def test_bad_pressure_config_is_a_usage_error() -> None:
    from datamachine import UsageError

    host = bootstrap.boot(":memory:", load_entrypoints=False)
    with pytest.raises(UsageError, match="budget_pressure"):
        host.run_conversation(USER, None, "scripted", "m",
                              payload={"budget_pressure": {"conversation_turns": {
                                  "tiers": [{"at": 2, "message": "x"}]}}})
    host.close()


def test_a_call_to_a_tool_wrap_up_hid_is_refused_not_run() -> None:
    model = Model()  # keeps calling step, tools offered or not
    pressure: dict[str, Any] = {"conversation_turns": {"wrap_up": {"allowed_tools": []}}}
    host, result = run(model, 10, pressure)
    ran = [r["result"] for r in result.result.tool_execution_results]
    # Turns 1-8 ran step; from turn 9 the request offered no tools and the calls were refused.
    assert len(ran) == 8
    stored = [m for m in result.result.messages if m.type == "tool_result"]
    refused = [m for m in stored if m.payload.get("error_type") == "tools_closed"]
    assert len(refused) == 2
    assert "tools are closed for this turn" in str(refused[0].content)
    host.close()
