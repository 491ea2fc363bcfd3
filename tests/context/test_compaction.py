"""The compaction strategies on their own (DESIGN.md 21): what each keeps, what it takes out,
and that a tool call never leaves without its result."""

from __future__ import annotations

import pytest

from agents_api import Message
from datamachine.context.compaction import (
    clear_tool_results,
    drop_oldest,
    is_summary,
    spans,
    split_for_summary,
    summary_message,
    summary_request_text,
    tail_start,
    view_problem,
)


def _turn(number: int, result: str = "x" * 500, *, text: str = "",
          calls: int = 1) -> list[Message]:
    """One answer: optional text, then ``calls`` calls each followed by its result (as the
    loop appends them)."""
    made = [Message.text("assistant", text)] if text else []
    for index in range(calls):
        call_id = f"c{number}-{index}"
        made.append(Message.tool_call("fetch", {"n": number}, number, call_id))
        made.append(Message.tool_result("fetch", {"success": True, "result": result}, number,
                                        call_id, result))
    return made


def _history(turns: int, **kwargs: object) -> list[Message]:
    messages = [Message.text("system", "be brief"), Message.text("user", "read the pages")]
    for number in range(1, turns + 1):
        messages += _turn(number, **kwargs)  # type: ignore[arg-type]
    return messages


def test_an_answer_its_calls_and_their_results_are_one_unit() -> None:
    messages = [Message.text("user", "go"), *_turn(1, text="let me look", calls=2),
                Message.text("user", "and?"), *_turn(2)]
    assert spans(messages) == [(0, 1), (1, 6), (6, 7), (7, 9)]


def test_the_tail_is_the_last_turns_with_the_question_before_them() -> None:
    messages = [Message.text("user", "first"), *_turn(1), Message.text("user", "second"),
                *_turn(2), *_turn(3)]
    units = spans(messages)
    assert messages[units[tail_start(messages, units, 2)][0]].content == "second"
    assert tail_start(messages, units, 0) == len(units)
    assert tail_start(messages, units, 10) == 0


def test_clear_tool_results_clears_only_results_older_than_the_tail() -> None:
    messages = _history(5)
    view, cleared = clear_tool_results(messages, 2, lambda size: size // 4)
    results = [m for m in view if m.type == "tool_result"]
    assert cleared == 3
    assert [str(m.content).startswith("[result of fetch cleared: 125 tokens")
            for m in results] == [True, True, True, False, False]
    assert all(m.metadata.get("cleared") for m in results[:3])
    # The transcript's messages are not touched, and clearing again clears nothing new.
    assert all(m.content == "x" * 500 for m in messages if m.type == "tool_result")
    assert clear_tool_results(view, 2, lambda size: size // 4)[1] == 0
    assert view_problem(view) is None


def test_short_results_are_not_worth_clearing() -> None:
    view, cleared = clear_tool_results(_history(4, result="42"), 1, lambda size: size)
    assert cleared == 0
    assert [m.content for m in view if m.type == "tool_result"] == ["42"] * 4


def test_drop_oldest_removes_whole_turns_and_keeps_what_is_pinned() -> None:
    messages = _history(6)
    view, removed = drop_oldest(messages, 2, 1, lambda m: 600)
    assert removed == 2  # the oldest turn: its call and its result
    assert view[:2] == messages[:2]  # the system message and the first question
    assert view_problem(view) is None
    everything, removed = drop_oldest(messages, 2, 10**9, lambda m: 600)
    assert removed == 8  # four turns; the last two are the tail
    assert [m.payload.get("turn") for m in everything if m.type == "tool_call"] == [5, 6]
    assert view_problem(everything) is None


def test_a_summary_replaces_the_turns_before_the_tail_and_is_kept_next_time() -> None:
    messages = _history(5)
    parts = split_for_summary(messages, 1)
    assert parts is not None
    head, summarized, tail = parts
    assert [m.role for m in head] == ["system", "user"]
    assert len(summarized) == 8
    assert len(tail) == 2
    summary = summary_message("notes", turn=6, covers=len(summarized))
    assert is_summary(summary)
    assert summary.metadata["compaction"] == {"strategy": "summarize", "turn": 6, "covers": 8}
    view = [*head, summary, *tail, *_turn(6), *_turn(7)]
    again = split_for_summary(view, 1)
    assert again is not None
    assert again[1][0] is summary  # the earlier summary is summarized into the new one


def test_nothing_to_summarize_when_only_the_tail_is_left() -> None:
    assert split_for_summary(_history(1), 1) is None


def test_what_the_summary_call_reads_is_text_and_bounded() -> None:
    text = summary_request_text(_history(40, result="y" * 3000)[2:], 5000)
    assert len(text) <= 5000 + 200
    assert text.startswith("[")
    assert "earlier message(s) left out" in text
    assert "Tool fetch returned: yyy" in text
    assert "characters cut" in text  # 3000-character results are cut to 2000


def test_view_problem_names_a_result_without_its_call_and_a_call_without_result() -> None:
    messages = _history(2)
    calls = [i for i, m in enumerate(messages) if m.type == "tool_call"]
    orphan = messages[: calls[0]] + messages[calls[0] + 1:]
    problem = view_problem(orphan)
    assert problem is not None
    assert "has no call before it" in problem
    unanswered = messages[:-1]
    problem = view_problem(unanswered)
    assert problem is not None
    assert "has no result" in problem


@pytest.mark.parametrize("keep", [0, 1, 3])
def test_no_strategy_separates_a_call_from_its_result(keep: int) -> None:
    messages = [Message.text("user", "go")]
    for number in range(1, 12):
        messages += _turn(number, text="thinking" if number % 2 else "",
                          calls=1 + number % 3)
        if number % 4 == 0:
            messages.append(Message.text("user", "keep going"))
    for size in (1, 5_000, 50_000):
        dropped = drop_oldest(messages, keep, size, lambda m: 700)[0]
        assert view_problem(dropped) is None
    assert view_problem(clear_tool_results(messages, keep, lambda s: s)[0]) is None
    parts = split_for_summary(messages, keep)
    if parts is not None:
        head, _summarized, tail = parts
        view = [*head, summary_message("s", turn=12, covers=1), *tail]
        assert view_problem(view) is None
