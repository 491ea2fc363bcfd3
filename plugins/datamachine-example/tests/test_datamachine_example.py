"""The example plugin as a host sees it: its budget, its tool, and a run the budget stops.

The model is scripted with the ``text_result`` hook, so nothing here reaches the network. Every
test boots its own host on an in-memory database.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import datamachine_example
import pytest
from datamachine_example import NOTES_WRITTEN, write_note

import bootstrap
from datamachine import ProviderRequest, hookimpl
from datamachine.host import Host


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's DATAMACHINE_* variables (DATAMACHINE_MAX_NOTES_WRITTEN...) stay out."""
    import os

    for name in list(os.environ):
        if name.startswith("DATAMACHINE_"):
            monkeypatch.delenv(name)


class NoteTaker:
    """A stand-in model that writes one note per turn, ``stop_after`` times, then answers.

    Without ``stop_after`` it never stops on its own. A request without tools is the final
    summary call the run makes when a budget stops it; it gets a short answer.
    """

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after

    @hookimpl
    def text_result(self, request: ProviderRequest) -> dict[str, Any]:
        if not request.tools:
            return {"content": "Summary: my notes are in the engine data."}
        if self.stop_after is not None and request.turn > self.stop_after:
            return {"content": "Done taking notes."}
        return {"content": "", "tool_calls": [
            {"id": f"n{request.turn}", "name": "write_note",
             "parameters": {"text": f"Observation number {request.turn}."}}]}


@pytest.fixture
def make_host() -> Iterator[Any]:
    hosts: list[Host] = []

    def make(*plugins: object) -> Host:
        host = bootstrap.boot(db_path=":memory:", plugins=[datamachine_example, *plugins],
                              load_entrypoints=False)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.close()


def ask(host: Host, **kwargs: Any) -> Any:
    return host.run_conversation([{"role": "user", "content": "Read the report, take notes."}],
                                 [write_note], "scripted", "test", **kwargs)


def test_the_plugin_registers_its_budget_and_its_tool(make_host: Any) -> None:
    host = make_host()
    assert host.budgets.get_spec("notes_written") == NOTES_WRITTEN
    assert host.budgets.owner("notes_written") == "datamachine_example"
    registered = host.tools.get("write_note")
    assert registered is not None
    assert (registered.function, registered.plugin) == (write_note.function, "datamachine_example")
    assert host.budgets.create("notes_written").ceiling() == 5


def test_the_installed_distribution_is_found_through_its_entry_point(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The way a real installation loads it: by entry point, narrowed to this distribution.
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "datamachine-example")
    with bootstrap.boot(db_path=":memory:") as host:
        info = host.plugins["example"]
        assert (info.distribution, info.source) == ("datamachine-example", "entrypoint")
        assert host.budgets.owner("notes_written") == "example"
        assert "write_note" in host.tools


def test_notes_go_to_the_engine_data_and_each_spends_one_unit(make_host: Any) -> None:
    engine_data: dict[str, Any] = {"topic": "quarterly report"}
    result = ask(make_host(NoteTaker(stop_after=2)), payload={"engine_data": engine_data})
    assert result.status == "completed"
    assert result.final_content == "Done taking notes."
    assert engine_data == {"topic": "quarterly report", "notes": [
        {"kind": "fact", "text": "Observation number 1."},
        {"kind": "fact", "text": "Observation number 2."}]}
    assert result.budgets["notes_written"]["current"] == 2
    assert [r["result"]["result"] for r in result.tool_execution_results] == [
        {"note_number": 1, "notes_left": 4}, {"note_number": 2, "notes_left": 3}]


def test_a_model_that_keeps_writing_notes_is_stopped_by_notes_written(make_host: Any) -> None:
    engine_data: dict[str, Any] = {}
    result = ask(make_host(NoteTaker()), payload={"engine_data": engine_data})
    assert result.status == "budget_exceeded"
    assert result.budget == "notes_written"
    assert result.flags == ["max_notes_written_reached"]
    assert result.warning == "Maximum notes written (5) reached."
    assert result.completed is False
    # The fifth note reached the ceiling and was the last one.
    assert len(engine_data["notes"]) == 5
    assert result.turn_count == 5
    # Graceful exhaustion: one tool-less call for a summary, which is not a turn.
    assert result.final_content == "Summary: my notes are in the engine data."


def test_the_setting_moves_the_ceiling_within_the_clamp(make_host: Any) -> None:
    host = make_host(NoteTaker())
    host.settings.set("max_notes_written", 2)
    engine_data: dict[str, Any] = {}
    result = ask(host, payload={"engine_data": engine_data})
    assert (result.budget, len(engine_data["notes"])) == ("notes_written", 2)

    host.settings.set("max_notes_written", 80)  # valid, but above the clamp of [1, 50]
    warnings: list[str] = []
    assert host.budgets.create("notes_written", warnings=warnings).ceiling() == 50
    assert warnings == ["Budget 'notes_written': requested ceiling 80 (from setting) is outside "
                        "its range [1, 50]; using 50."]


def test_an_empty_note_is_refused_without_spending_budget(make_host: Any) -> None:
    class EmptyThenDone:
        @hookimpl
        def text_result(self, request: ProviderRequest) -> dict[str, Any]:
            if request.turn == 1:
                return {"tool_calls": [{"name": "write_note", "parameters": {"text": "  "}}]}
            return {"content": "Nothing worth noting."}

    result = ask(make_host(EmptyThenDone()))
    assert result.status == "completed"
    outcome = result.tool_execution_results[0]["result"]
    assert (outcome["success"], outcome["error_type"]) == (False, "empty_note")
    # The budget is created on first use, and the empty note never got that far.
    assert "notes_written" not in result.budgets


def test_typed_arguments_are_checked_before_the_note_is_written() -> None:
    from datamachine_example import write_note

    from datamachine.tools import ToolExecutor

    assert write_note.parameters["properties"]["kind"] == {
        "enum": ["fact", "todo", "question"], "type": "string", "default": "fact",
        "description": "What the note is: a fact found, something still to do, or an open "
                       "question."}
    assert write_note.parameters["properties"]["text"]["maxLength"] == 500
    executor = ToolExecutor([write_note])
    engine_data: dict[str, Any] = {}
    executor.engine_data = engine_data
    result = executor({"id": "c", "name": "write_note",
                       "parameters": {"text": "x" * 600, "kind": "idea"}}, {})
    assert isinstance(result, dict)
    assert result["error_type"] == "invalid_arguments"
    assert result["invalid_arguments"] == [
        "text: String should have at most 500 characters (got \"" + "x" * 56 + "...)",
        "kind: Input should be 'fact', 'todo' or 'question' (got \"idea\")"]
    assert engine_data == {}


def test_the_installed_plugin_under_the_shipped_pytest_fixtures(
        dm_host: Host, scripted_model: Any) -> None:
    """What a plugin author's own suite looks like with datamachine's pytest plugin: the
    installed plugin is loaded by ``dm_host``, and ``scripted_model`` is the model."""
    scripted_model.enqueue(
        *({"tool_calls": [{"name": "write_note", "parameters": {"text": f"Observation {n}."}}]}
          for n in (1, 2)), "Two notes taken.")
    tool = dm_host.tools.get("write_note")
    assert tool is not None
    result = dm_host.run_conversation([{"role": "user", "content": "Take notes."}], [tool])
    assert (result.status, result.final_content) == ("completed", "Two notes taken.")
    assert result.budgets[NOTES_WRITTEN.name]["current"] == 2
    assert len(scripted_model.requests) == 3
