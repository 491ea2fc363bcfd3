"""Usage a provider does not report is None ("not reported"), never 0 (DESIGN.md 25): in the
result, in a session's stored total, and in the command line's report."""

from __future__ import annotations

from typing import Any

import bootstrap
from datamachine.cli.output import tokens_text
from datamachine.testing import FunctionModel

ASK = [{"role": "user", "content": "hi"}]


def test_a_run_whose_provider_reports_no_usage_says_not_reported() -> None:
    with bootstrap.boot(":memory:", plugins=[FunctionModel(lambda m, t: "hello")],
                        load_entrypoints=False) as host:
        result = host.run_conversation(ASK, provider="function")
    assert result.usage == {"prompt_tokens": None, "completion_tokens": None,
                            "total_tokens": None}
    assert tokens_text(result.usage) == "not reported by the provider"


def test_a_failed_request_reports_nothing_rather_than_zero() -> None:
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        result = host.run_conversation(ASK, None, "scripted", "m", max_turns=1,
                                       payload={"script": [{"error": "down"}]})
    assert result.status == "error"
    assert result.turn_count == 1
    assert result.usage["total_tokens"] is None  # a request went out; nothing was reported


def test_a_session_total_counts_only_what_was_reported() -> None:
    answers: list[Any] = ["first, no usage",
                          {"content": "second", "usage": {"prompt_tokens": 4,
                                                          "completion_tokens": 1,
                                                          "total_tokens": 5}}]
    with bootstrap.boot(":memory:", plugins=[FunctionModel(lambda m, t: answers.pop(0))],
                        load_entrypoints=False) as host:
        session = host.chat_sessions.create()
        first = host.chat(session.id, "one", provider="function")
        assert first.usage["total_tokens"] is None
        host.chat(session.id, "two", provider="function")
        stored = host.transcripts.summary(session.id).result["session_usage"]
    assert stored == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}


def test_the_command_line_report_shows_counts_and_gaps() -> None:
    assert tokens_text({"prompt_tokens": 23, "completion_tokens": 8, "total_tokens": 31}) == (
        "31 (prompt 23, completion 8)")
    assert tokens_text({"prompt_tokens": 23, "completion_tokens": None,
                        "total_tokens": None}) == (
        "not reported (prompt 23, completion not reported)")
