"""Inputs a review of the public entry points found escaping as raw Python errors, accepted
and breaking something later, or refused with a message that pointed at the wrong fix.

Each test failed before its fix: the error is now typed, names the field, and comes before
anything is stored.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import bootstrap
import datamachine
from agents_api import Message
from datamachine import CompactedView, InvalidBudgetValue, InvalidToolDefinition, UsageError
from datamachine.errors import InvalidBudgetSpec, PluginLoadError, SessionNotPaused
from datamachine.host import Host

USER = [{"role": "user", "content": "go"}]


def look() -> str:
    """Look around."""
    return "a room"


# -- host.chat: a callback that cannot be called ----------------------------------------------

def test_chat_refuses_an_on_text_it_cannot_call_before_storing_the_message(host: Host) -> None:
    session = host.chat_sessions.create().id
    with pytest.raises(UsageError, match="on_text must be a function"):
        host.chat(session, "hi", on_text="print",  # type: ignore[arg-type]
                  payload={"script": [{"content": "hello"}]})
    # Nothing of the refused turn is kept: the next message is the session's first.
    after = host.chat(session, "again", payload={"script": [{"content": "x"}]})
    assert [(m.role, m.content) for m in after.messages] == [
        ("user", "again"), ("assistant", "x")]


# -- tools ------------------------------------------------------------------------------------

def test_effects_declared_none_is_undeclared_so_read() -> None:
    tool = datamachine.Tool(name="look", description="Look around.", function=look,
                            runtime={"effects": None})
    assert tool.effects == "read"  # was "None": stored as an intent, then "in doubt"


@pytest.mark.parametrize("runtime", ["x", [1], 5])
def test_the_decorator_refuses_runtime_options_that_are_not_a_dict(runtime: Any) -> None:
    with pytest.raises(InvalidToolDefinition, match=r"@tool\(runtime=\.\.\.\) must be a dict"):
        datamachine.tool(runtime=runtime)(look)


# -- boot -------------------------------------------------------------------------------------

def test_boot_names_a_db_path_that_is_no_path() -> None:
    with pytest.raises(UsageError, match="db_path must be a file path"):
        bootstrap.boot(5, load_entrypoints=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(("plugins", "named"), [
    (None, "plugins must be a list"),
    (5, "plugins must be a list"),
    ("datamachine.testing", "plugins must be a list"),
    (["datamachine.testing"], r"plugins\[0\] is the text 'datamachine.testing'.*import_module"),
    ([5], r"plugins\[0\] must be a plugin module"),
])
def test_boot_refuses_plugins_that_would_load_nothing(plugins: Any, named: str) -> None:
    with pytest.raises(PluginLoadError, match=named):
        bootstrap.boot(":memory:", plugins=plugins, load_entrypoints=False)


# -- host.resolve -----------------------------------------------------------------------------

@pytest.mark.parametrize(("result", "named"), [
    (object(), "result must be JSON data"),
    (math.nan, "result: NaN and infinities are not JSON"),
    ({"sent": [1, math.inf]}, r"result\['sent'\]\[1\]: NaN"),
])
def test_resolve_refuses_a_result_that_would_not_read_back(host: Host, result: Any,
                                                           named: str) -> None:
    with pytest.raises(UsageError, match=named):
        host.resolve("s1", "c1", result)


# -- a compaction hook's answer ---------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "named"), [
    ((None, "mine"), "CompactedView.messages must be a list"),
    (("abc", "mine"), "CompactedView.messages must be a list"),
    (([{"role": "user", "content": "x"}], "mine"), "CompactedView.messages must be a list"),
    (([], 5), "CompactedView.strategy must be"),
    (([], "mine", 5), "CompactedView.summary must be"),
])
def test_a_compacted_view_checks_itself_when_made(arguments: tuple[Any, ...],
                                                  named: str) -> None:
    with pytest.raises(UsageError, match=named):
        CompactedView(*arguments)


def test_a_good_compacted_view_is_made() -> None:
    view = CompactedView([Message.text("user", "x")], "mine", "a summary")
    assert view.summary == "a summary"
    # What the run took before the check: a tuple of messages (kept as a list) and no name.
    loose = CompactedView((Message.text("user", "x"),), None)  # type: ignore[arg-type]
    assert isinstance(loose.messages, list)
    assert loose.strategy is None


# -- budgets: messages that name the right fix ------------------------------------------------

def test_a_ceiling_no_budget_takes_points_at_the_budgets_list(host: Host) -> None:
    with pytest.raises(InvalidBudgetValue) as caught:
        host.run_conversation(USER, payload={"budget_ceilings": {"stuck_turns": -1}})
    message = str(caught.value)
    assert "`datamachine budgets list`" in message
    assert "1,000,000,000,000" not in message  # not stuck_turns' range
    assert host.transcripts.list() == []


def test_a_refused_ceiling_says_the_budget_clamp_too(host: Host) -> None:
    with pytest.raises(InvalidBudgetValue,
                       match=r"between 1 and 10,000 \(this budget then clamps it to 1 to 20, "
                             r"with a warning\), got 0"):
        host.run_conversation(USER, payload={"budget_ceilings": {"stuck_turns": 0}})


def test_a_budget_registered_after_boot_cannot_take_another_budget_setting(host: Host
                                                                            ) -> None:
    with pytest.raises(InvalidBudgetSpec, match="budget 'conversation_turns' reads it"):
        host.budgets.register("y", {"setting": "max_turns", "default": 5, "max": 10})
    assert not host.budgets.is_registered("y")


def test_create_names_warnings_that_are_not_a_list(host: Host) -> None:
    with pytest.raises(UsageError, match="warnings must be a list"):
        host.budgets.create("conversation_turns", ceiling_override=1000,
                            warnings="x")  # type: ignore[arg-type]


# -- resume: a pause id that is not the one waiting -------------------------------------------

def test_resume_with_a_wrong_pause_id_names_the_one_waiting(host: Host) -> None:
    call = {"tool_calls": [{"id": "l1", "name": "look", "parameters": {}}]}
    paused = host.run_conversation(
        USER, [datamachine.tool(look)], "scripted", "m", max_turns=1,
        payload={"transcript_session_id": "tea", "confirmation": "pause", "script": [call]})
    assert paused.status == "awaiting_confirmation"
    assert paused.pending is not None
    waiting = paused.pending["pause_id"]
    with pytest.raises(SessionNotPaused, match=f"waiting for the answer to pause '{waiting}', "
                                               "not 'wrong'.*or the id is wrong"):
        host.resume("tea", True, pause_id="wrong")
    # Nothing was answered: the right id still answers it.
    assert host.resume("tea", False, pause_id=waiting).status != "awaiting_confirmation"


def test_a_misspelt_budget_ceiling_is_named_with_the_budget_it_was_meant_for(host: Host
                                                                             ) -> None:
    result = host.run_conversation(USER, payload={
        "script": [{"content": "hi"}],
        "budget_ceilings": {"max_turns": 1, "context_token": 500, "my_own": 3}})
    assert result.warnings == [
        "payload['budget_ceilings']['max_turns']: no budget is named 'max_turns', so this "
        "ceiling limits only a budget a tool makes under that name; did you mean "
        "'conversation_turns'?",
        "payload['budget_ceilings']['context_token']: no budget is named 'context_token', so "
        "this ceiling limits only a budget a tool makes under that name; did you mean "
        "'context_tokens'?"]  # a name like no budget's ("my_own": a tool's own) says nothing


def test_a_per_tool_ceiling_is_no_misspelling(host: Host) -> None:
    result = host.run_conversation(USER, payload={
        "script": [{"content": "hi"}], "budget_ceilings": {"tool_calls_ls": 2}})
    assert result.warnings == []


class _BudgetPlugin:
    def __init__(self, budget: str) -> None:
        self.budget = budget

    @datamachine.hookimpl
    def register_budgets(self) -> list[tuple[str, dict[str, Any]]]:
        return [(self.budget, {"default": 3, "max": 10, "setting": "shared_limit"})]


def test_two_plugins_feeding_budgets_from_one_setting_stop_the_boot_naming_both() -> None:
    from datamachine.errors import DuplicateSettingError

    with pytest.raises(DuplicateSettingError,
                       match=r"'shared_limit' feeds budget '[ab]_budget' of '.+' and budget "
                             r"'[ab]_budget' of '.+'"):
        bootstrap.boot(":memory:", plugins=[_BudgetPlugin("a_budget"), _BudgetPlugin("b_budget")],
                       load_entrypoints=False)


def test_a_tool_failing_on_a_library_error_logs_one_line_not_a_traceback(
        host: Host, caplog: pytest.LogCaptureFixture) -> None:
    @datamachine.tool
    def fetch(url: str, context: datamachine.ToolContext) -> str:
        """Fetch a page."""
        context.budget("fetches")  # the site's setting of it is bad
        return "a page"

    host.budgets.register("fetches", {"default": 3, "max": 10, "setting": "max_fetches_x"})
    call = {"tool_calls": [{"id": "f1", "name": "fetch", "parameters": {"url": "u"}}]}
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATAMACHINE_MAX_FETCHES_X", "x")
        with caplog.at_level("WARNING", logger="datamachine"):
            result = host.run_conversation(USER, [fetch], payload={
                "script": [call, {"content": "done"}]})
    assert result.status == "completed"
    raised = [r for r in caplog.records if "tool 'fetch' raised" in r.getMessage()]
    assert len(raised) == 1
    assert "InvalidBudgetValue" in raised[0].getMessage()
    assert "max_fetches_x" in raised[0].getMessage()
    assert raised[0].exc_info is None
