"""The loop guard (DESIGN 23) from a scripted model that records every request it receives:
each signal, the ladder seen in the requests (the nudge only there, never stored; the hidden
tool gone from later requests), the stop and its summary, the pause and its resume, progress
resetting the count, a plugin's signal, and a healthy run left alone."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import ProviderRequest, UsageError, hookimpl, tool
from datamachine.host import Host
from datamachine.loop_guard import GuardTurn

USER = [{"role": "user", "content": "Find the population of Atlantis."}]


@tool
def lookup(city: str) -> dict[str, Any]:
    """Look a city up.

    Args:
        city: The city.
    """
    if city == "Atlantis":
        raise ValueError(f"no city named {city}")
    return {"city": city, "population": len(city) * 1000}


@tool(runtime={"duplicate_policy": "repeatable"})
def weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return "sunny"


@tool(runtime={"duplicate_policy": "repeatable"})
def clock(city: str) -> str:
    """The time in a city.

    Args:
        city: The city.
    """
    return "noon"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"name": name, "parameters": arguments}]}


def say(text: str) -> dict[str, Any]:
    return {"content": text}


class Model:
    """Answers each turn from ``script`` (the last answer repeats) and the final summary with
    a fixed text; keeps every request."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.requests: list[ProviderRequest] = []

    @hookimpl
    def text_result(self, request: ProviderRequest) -> Any:
        self.requests.append(request)
        if not request.tools and "[BUDGET EXHAUSTED]" in str(request.messages[-1]["content"]):
            return {"content": "Summary: Atlantis could not be found."}
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def turn_requests(self) -> list[ProviderRequest]:
        return [r for r in self.requests
                if "[BUDGET EXHAUSTED]" not in str(r.messages[-1]["content"])]


def boot(*plugins: object) -> Host:
    return bootstrap.boot(":memory:", plugins=list(plugins), load_entrypoints=False)


def run(host: Host, tools: list[Any], max_turns: int = 12, **payload: Any
        ) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    payload.setdefault("event_sink", lambda event, data: events.append((event, data)))
    result = host.run_conversation(USER, tools, "scripted", "m", mode="chat",
                                   max_turns=max_turns, payload=payload)
    return result, events


def guard_events(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [data for event, data in events if event == "loop_guard"]


def nudges(request: ProviderRequest) -> list[str]:
    return [str(m["content"]) for m in request.messages
            if str(m.get("content", "")).startswith("[LOOP GUARD")]


def offered(request: ProviderRequest) -> list[str]:
    return [t["name"] for t in request.tools or []]


# -- the ladder, on a repeated failing call ---------------------------------------------------
def test_a_repeated_failing_call_is_nudged_then_hidden_then_stopped_with_a_summary() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        result, events = run(host, [lookup, weather])
    steps = guard_events(events)
    assert [(e["signal"], e["tool"], e["step"], e["turn"]) for e in steps] == [
        ("repeated_failure", "lookup", "nudge", 2),
        ("repeated_failure", "lookup", "hide_tool", 3),
        ("hidden_tool_called", "lookup", "stop", 4),
    ]
    assert (result.status, result.budget) == ("budget_exceeded", "stuck_turns")
    assert result.flags == ["max_stuck_turns_reached"]
    assert result.turn_count == 4  # not 12: the guard stopped it
    assert result.final_content == "Summary: Atlantis could not be found."
    assert result.budgets["stuck_turns"]["current"] == 3
    turns = model.turn_requests()
    assert [len(nudges(r)) for r in turns] == [0, 0, 1, 0]  # the nudge: request 3 only
    assert "'lookup' again with the same arguments" in nudges(turns[2])[0]
    assert [offered(r) for r in turns] == [["lookup", "weather"]] * 3 + [["weather"]]
    # The nudge was never stored; the hidden tool's call was refused, not run.
    assert not any("[LOOP GUARD" in str(m.content) for m in result.messages)
    refused = [m for m in result.messages if m.type == "tool_result"][-1]
    assert refused.payload["error_type"] == "tool_hidden"


def test_progress_resets_the_count_and_the_ladder() -> None:
    model = Model([call("lookup", city="Atlantis"), call("lookup", city="Atlantis"),
                   call("lookup", city="Paris"), call("lookup", city="Atlantis"),
                   say("Paris has 5000 people; Atlantis is not a city.")])
    with boot(model) as host:
        result, events = run(host, [lookup])
    assert [(e["turn"], e["step"], e["count"]) for e in guard_events(events)] == [
        (2, "nudge", 1), (4, "nudge", 1)]  # turn 3 found something new: back to 0
    assert result.status == "completed"
    # The final answer ends the run: it is not judged, so the count stays where turn 4 left it.
    assert result.budgets["stuck_turns"]["current"] == 1


def test_two_calls_alternating_without_new_results_are_a_signal() -> None:
    model = Model([call("weather", city="Oslo"), call("clock", city="Oslo")] * 4)
    with boot(model) as host:
        result, events = run(host, [weather, clock], loop_guard=["nudge"])
    first = guard_events(events)[0]
    assert (first["signal"], first["turn"], first["step"]) == ("alternating_calls", 4, "nudge")
    assert result.budget == "stuck_turns"  # the last step repeats until the budget is spent
    assert [e["step"] for e in guard_events(events)] == ["nudge", "nudge", "stop"]


def test_the_same_text_twice_without_a_tool_is_a_signal() -> None:
    model = Model([say("I will save it later.")])
    with boot(model) as host:
        result, events = run(host, [lookup], completion_assertions={
            "required_tool_names": ["lookup"]})
    steps = guard_events(events)
    assert [(e["signal"], e["tool"], e["step"]) for e in steps] == [
        ("repeated_text", None, "nudge"), ("repeated_text", None, "nudge"),
        ("repeated_text", None, "stop")]  # no tool to hide: a nudge instead
    assert result.budget == "stuck_turns"
    assert "lookup" in offered(model.turn_requests()[-1])


def test_a_healthy_run_with_many_different_calls_is_never_touched() -> None:
    cities = ["Paris", "Oslo", "Lima", "Rome", "Kyiv", "Cairo", "Quito", "Hanoi"]
    model = Model([*(call("lookup", city=c) for c in cities), say("Done.")])
    with boot(model) as host:
        result, events = run(host, [lookup], max_turns=20)
    assert guard_events(events) == []
    assert result.status == "completed"
    assert "stuck_turns" not in result.budgets  # it never counted
    assert all(not nudges(r) for r in model.requests)


# -- configuration --------------------------------------------------------------------------
def test_off_leaves_the_repeats_to_the_turn_budget() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        result, events = run(host, [lookup], max_turns=6, loop_guard="off")
    assert guard_events(events) == []
    assert (result.budget, result.turn_count) == ("conversation_turns", 6)


@pytest.mark.parametrize(("where", "ladder", "ceiling", "steps"), [
    ("payload", ["stop"], None, ["stop"]),
    ("setting", ["hide_tool", "nudge"], None, ["hide_tool", "nudge", "stop"]),
    ("payload", ["nudge"], 5, ["nudge", "nudge", "nudge", "nudge", "stop"]),
])
def test_the_ladder_and_the_budget_come_from_the_payload_or_the_settings(
    where: str, ladder: list[str], ceiling: int | None, steps: list[str]
) -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        payload: dict[str, Any] = {}
        if where == "payload":
            payload["loop_guard"] = ladder
        else:
            host.settings.set("loop_guard", ladder)
        if ceiling is not None:
            host.settings.set("max_stuck_turns", ceiling)
        result, events = run(host, [lookup, weather], max_turns=20, **payload)
    assert [e["step"] for e in guard_events(events)] == steps
    assert (result.budget, result.flags) == ("stuck_turns", ["max_stuck_turns_reached"])
    assert result.budgets["stuck_turns"]["ceiling"] == (ceiling or 3)


def test_a_run_override_and_the_clamp_of_stuck_turns() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        result, _ = run(host, [lookup], max_turns=40, loop_guard=["nudge"],
                        budget_ceilings={"stuck_turns": 99})
    assert result.budgets["stuck_turns"]["ceiling"] == 20
    assert any("stuck_turns" in w and "[1, 20]" in w for w in result.warnings)


@pytest.mark.parametrize("bad", [[], ["nudge", "shout"], "sometimes", 3])
def test_a_bad_ladder_is_refused_before_the_run(bad: object) -> None:
    model = Model([say("x")])
    with boot(model) as host:
        with pytest.raises(UsageError, match="loop_guard"):
            run(host, [lookup], loop_guard=bad)
        with pytest.raises(UsageError, match="loop_guard"):
            host.settings.set("loop_guard", bad)
    assert model.requests == []


# -- a person decides -----------------------------------------------------------------------
def test_a_stuck_run_pauses_for_a_person_and_goes_on_when_approved() -> None:
    model = Model([call("lookup", city="Atlantis"), call("lookup", city="Atlantis"),
                   call("lookup", city="Atlantis"), call("lookup", city="Atlantis"),
                   call("lookup", city="Paris"), say("Paris it is.")])
    with boot(model) as host:
        paused, _ = run(host, [lookup], confirmation="pause")
        assert paused.status == "awaiting_confirmation"
        assert paused.pending["kind"] == "stuck"
        assert paused.pending["budget"] == "stuck_turns"
        assert "kept repeating itself" in paused.warning
        assert paused.pending["hidden_tools"] == ["lookup"]
        session = paused.transcript_session_id
        asked = len(model.turn_requests())
        done = host.resume(session, approve=True)
    assert done.status == "completed"
    assert done.final_content == "Paris it is."
    # The tool the guard took away stays away for the rest of the run (DESIGN 23), across
    # the pause: not offered again, and a call to it is refused, not run.
    assert all("lookup" not in offered(r) for r in model.turn_requests()[asked:])
    resumed = [m.payload for m in done.messages[len(paused.messages):]
               if m.type == "tool_result"]
    assert [(r["tool_name"], r["error_type"]) for r in resumed] == [("lookup", "tool_hidden")]
    # Approved, the count started again: the refused call counted once, and the run ended
    # with its answer.
    assert done.budgets["stuck_turns"]["current"] == 1


def test_after_an_approval_the_guard_counts_again_from_zero() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        paused, _ = run(host, [lookup], confirmation="pause")
        again = host.resume(paused.transcript_session_id, approve=True)
    assert paused.turn_count == 4
    assert again.status == "awaiting_confirmation"
    assert again.pending is not None
    assert again.pending["kind"] == "stuck"
    # The tool stays hidden: each call to it in the resumed run is a signal from the first,
    # so three of them spend the budget again.
    assert again.turn_count == 3
    assert again.budgets["stuck_turns"]["current"] == 3


def test_a_decline_stops_the_run_even_with_the_guard_switched_off_since_the_pause() -> None:
    """Before: the resumed run had no stuck_turns budget (the guard was off), so the loop had
    nothing to stop on, ignored the "no" and ran on until its turns were spent."""
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        paused, _ = run(host, [lookup], confirmation="pause")
        host.settings.set("loop_guard", "off")
        asked = len(model.turn_requests())
        done = host.resume(paused.transcript_session_id, approve=False)
    assert (done.status, done.budget, done.flags) == (
        "budget_exceeded", "stuck_turns", ["max_stuck_turns_reached"])
    assert done.turn_count == 0
    assert len(model.turn_requests()) == asked  # nothing more was asked of the model
    assert done.final_content == "Summary: Atlantis could not be found."


def test_a_stuck_run_declined_by_a_person_stops_with_its_summary() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        paused, _ = run(host, [lookup], confirmation="pause")
        done = host.resume(paused.transcript_session_id, approve=False)
    assert (done.status, done.budget, done.flags) == (
        "budget_exceeded", "stuck_turns", ["max_stuck_turns_reached"])
    assert done.final_content == "Summary: Atlantis could not be found."


def test_confirm_continuation_is_asked_with_kind_stuck() -> None:
    asked: list[str] = []

    class GoOn:
        @hookimpl
        def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool:
            asked.append(context["kind"])
            return len(asked) == 1  # once yes, then no

    model = Model([call("lookup", city="Atlantis")])
    with boot(model, GoOn()) as host:
        result, events = run(host, [lookup], max_turns=20)
    assert asked == ["stuck", "stuck"]
    assert result.budget == "stuck_turns"
    assert len(guard_events(events)) == 6  # three signals, a reset by the person, three more


# -- a plugin's signal ----------------------------------------------------------------------
@tool
def flaky(n: int) -> str:
    """A service that is down.

    Args:
        n: Which attempt.
    """
    raise RuntimeError("service unavailable")


def test_a_plugin_adds_a_signal_that_counts_like_the_built_in_ones() -> None:
    seen: list[list[GuardTurn]] = []

    class Apologies:
        @hookimpl
        def detect_stuck(self, turns: list[GuardTurn], context: dict[str, Any]) -> str | None:
            seen.append(list(turns))
            return "apologizing" if "sorry" in turns[-1].text.lower() else None

    # Each call is new (no built-in signal) and fails (no progress): only the plugin sees it.
    model = Model([{"content": f"Sorry, attempt {n}.", "tool_calls": [
        {"name": "flaky", "parameters": {"n": n}}]} for n in range(1, 9)])
    with boot(model, Apologies()) as host:
        result, events = run(host, [flaky], max_turns=8)
    assert [len(turns) for turns in seen] == [1, 2, 3]
    first = seen[0][0]
    assert (first.turn, first.calls[0].name, first.calls[0].success) == (1, "flaky", False)
    assert first.calls[0].error_type is not None
    assert [(e["signal"], e["tool"], e["step"]) for e in guard_events(events)] == [
        ("apologizing", None, "nudge"), ("apologizing", None, "nudge"),
        ("apologizing", None, "stop")]
    assert result.budget == "stuck_turns"


def test_a_plugin_that_raises_does_not_end_the_run() -> None:
    class Broken:
        @hookimpl
        def detect_stuck(self, turns: list[GuardTurn], context: dict[str, Any]) -> str | None:
            raise RuntimeError("detector bug")

    model = Model([call("lookup", city="Paris"), say("Paris: 5000.")])
    with boot(model, Broken()) as host:
        result, events = run(host, [lookup])
    assert result.status == "completed"
    assert guard_events(events) == []


# -- what is kept, and a real wire format ---------------------------------------------------
def test_the_guard_s_steps_are_on_the_stored_timeline_the_viewer_reads() -> None:
    from datamachine.server.ui.present import mark_text

    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        result, _ = run(host, [lookup])
        marks = [m for m in host.transcripts.timeline(result.transcript_session_id)
                 if m["event"] == "loop_guard"]
    assert [(m["turn"], m["signal"], m["step"]) for m in marks] == [
        (2, "repeated_failure", "nudge"), (3, "repeated_failure", "hide_tool"),
        (4, "hidden_tool_called", "stop")]
    assert mark_text(marks[1]) == ("Loop guard: repeated failure (lookup), 2/3 turns stuck: "
                                   "tool lookup was taken away.")


def test_against_the_openai_wire_format_on_a_loopback_server() -> None:
    import json

    from datamachine.providers.openai import OpenAIProvider
    from tests.providers.fake_openai import FakeOpenAIServer, RecordingSleep, Reply, completion

    looked_up = {"id": "c1", "type": "function",
                 "function": {"name": "lookup", "arguments": json.dumps({"city": "Atlantis"})}}
    with FakeOpenAIServer() as server:
        server.enqueue(*[Reply(body=completion(None, tool_calls=[looked_up]))] * 4,
                       Reply(body=completion("Atlantis is a myth.")))
        with boot() as host:
            host.providers.register(OpenAIProvider(
                name="loopback", base_url=server.url + "/v1", api_key="sk-test",
                sleep=RecordingSleep(), jitter=lambda: 0.0))
            result = host.run_conversation(USER, [lookup, weather], "loopback", "gpt-test",
                                           mode="chat", max_turns=10)
        bodies = [request.json for request in server.requests]
    assert (result.status, result.budget) == ("budget_exceeded", "stuck_turns")
    assert result.final_content == "Atlantis is a myth."  # the summary request's answer
    tools = [[t["function"]["name"] for t in body.get("tools", [])] for body in bodies]
    assert tools[:4] == [["lookup", "weather"]] * 3 + [["weather"]]
    assert "tools" not in bodies[4]  # the final summary offers none
    guard_notes = [[m["content"] for m in body["messages"]
                    if m["role"] == "user" and "[LOOP GUARD" in str(m["content"])]
                   for body in bodies]
    assert [len(notes) for notes in guard_notes] == [0, 0, 1, 0, 0]


# -- found by review: each failed before its fix ------------------------------------------------
@tool(runtime={"requires_approval": True})
def danger(n: int) -> str:
    """Do something risky.

    Args:
        n: Which.
    """
    raise RuntimeError("refused by the backend")


@tool
def down(n: int) -> str:
    """Always fails.

    Args:
        n: Which.
    """
    raise RuntimeError("down")


def test_the_calls_a_resumed_run_runs_first_are_judged_once_each() -> None:
    """They ran outside a watched turn: each is judged on its own, never re-judged with the
    next, so one paused turn never counts as a repeated failure of itself."""
    waiting = {"content": "", "tool_calls": [{"name": "danger", "parameters": {"n": 1}},
                                             {"name": "down", "parameters": {"n": 2}},
                                             {"name": "down", "parameters": {"n": 3}}]}
    model = Model([waiting, say("ok, giving up"), say("done")])
    with boot(model) as host:
        paused, _ = run(host, [danger, down], confirmation="pause")
        assert paused.pending is not None
        done = host.resume(paused.transcript_session_id, approve=True)
    assert done.status == "completed"
    assert offered(model.requests[-1]) == ["danger", "down"]  # nothing hidden
    assert not any(nudges(request) for request in model.requests)


def test_a_call_that_failed_before_is_a_signal_even_when_it_now_works() -> None:
    from agents_api import IterationBudget
    from datamachine.loop_guard.guard import LoopGuard

    seen: list[str] = []
    guard = LoopGuard(lambda: IterationBudget("stuck_turns", 3), ("nudge",),
                      emit=lambda event, data: seen.append(data["signal"]), hidden=set())
    budgets: dict[str, IterationBudget] = {}
    idle = {"success": True, "data": "idle"}
    guard.answered(1, "", 1, budgets)
    guard.ran("status", {}, idle, budgets)
    guard.answered(2, "", 1, budgets)
    guard.ran("status", {}, {"success": False, "error": "closed", "error_type": "x"}, budgets)
    guard.answered(3, "", 1, budgets)
    guard.ran("status", {}, dict(idle), budgets)  # works again, with what it gave before
    assert seen == ["repeated_failure"]  # turn 3 repeats turn 2's failed call
    assert budgets["stuck_turns"].current() == 1


def test_a_person_is_asked_even_at_the_top_of_the_clamp() -> None:
    model = Model([call("lookup", city="Atlantis")])
    with boot(model) as host:
        paused, _ = run(host, [lookup], max_turns=30, confirmation="pause",
                        loop_guard=["nudge"], budget_ceilings={"stuck_turns": 20})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    assert paused.pending["kind"] == "stuck"


class Feed:
    """A tool that hands out its own list, which grows on every call: each call's result is
    new when it is made, and the same object as every other one."""

    def __init__(self) -> None:
        self.items: list[int] = []

    def read(self, topic: str) -> list[int]:
        """Read the feed.

        Args:
            topic: The topic.
        """
        self.items.append(len(self.items) + 1)
        return self.items


def test_a_result_is_judged_new_as_it_was_when_the_tool_returned_it() -> None:
    # The second read returned [1, 2] after [1]: new then, even though the tool's list has
    # grown since. Judging it by what the list holds later would see two alike results and an
    # A, B, A, B with nothing new.
    feed = tool(name="feed", runtime={"duplicate_policy": "repeatable"})(Feed().read)
    model = Model([call("feed", topic="news"), call("clock", city="Oslo"),
                   call("feed", topic="news"), call("clock", city="Oslo"), say("Done.")])
    with boot(model) as host:
        result, events = run(host, [feed, clock])
    assert guard_events(events) == []
    assert result.status == "completed"
    assert all(not nudges(r) for r in model.requests)
