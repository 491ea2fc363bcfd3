"""``ConversationResult._repr_markdown_``: what a notebook shows for a result (DESIGN.md 25):
the status, why the run stopped, its budgets and the answer."""

from __future__ import annotations

from datamachine.conversation.result import ConversationResult
from datamachine.host import Host

USER = [{"role": "user", "content": "hi"}]


def test_a_completed_run_shows_status_reason_budgets_and_answer(host: Host) -> None:
    result = host.run_conversation(USER, payload={"script": [{"content": "# Done\n\nAll *good*."}]})
    shown = result._repr_markdown_()
    assert shown.startswith(f"**Run completed** (`completed`) · 1 turn · transcript "
                            f"`{result.transcript_session_id}`\n")
    assert "**Stopped:** the model gave its final answer." in shown
    assert "| budget | used | ceiling | left |" in shown
    assert "| conversation_turns | 1 | 25 | 24 |" in shown
    assert shown.endswith("**Answer**\n\n# Done\n\nAll *good*.\n")  # the model's Markdown


def test_a_budget_stop_names_the_budget_and_marks_it_spent(host: Host) -> None:
    script = [{"tool_calls": [{"name": "nope", "parameters": {"i": 1}}]},
              {"content": "Partial | summary"}]
    result = host.run_conversation(USER, max_turns=1, payload={"script": script})
    shown = result._repr_markdown_()
    assert shown.startswith("**Run budget exceeded** (`budget_exceeded`) · 1 turn")
    assert "**Stopped:** budget `conversation_turns` ran out (1/1)." in shown
    assert "| conversation_turns (spent) | 1 | 1 | 0 |" in shown
    assert "Partial | summary" in shown  # the answer is Markdown, not a table cell


def test_an_error_and_an_empty_answer_say_so() -> None:
    result = ConversationResult(status="error", error="the model server is down",
                                error_code="provider_connection_error",
                                budgets={"odd|name": {"current": 0, "ceiling": None}})
    shown = result._repr_markdown_()
    assert "**Stopped:** error `provider_connection_error`: the model server is down" in shown
    assert "| odd\\|name | 0 | - | - |" in shown
    assert shown.endswith("_(no final answer)_\n")
    assert "transcript" not in shown.splitlines()[0]


def test_a_paused_run_says_how_to_answer_it() -> None:
    result = ConversationResult(status="awaiting_confirmation", completed=False,
                                warning="Budget 'tool_calls' is spent.",
                                transcript_session_id="s1")
    assert "`host.resume('s1', approve=True)`" in result._repr_markdown_()
