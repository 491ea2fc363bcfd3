"""Tools with runtime requires_approval: asked through confirm_continuation (ask mode)."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import hookimpl
from datamachine.tools import Tool

SENT: list[str] = []


def _send(to: str) -> str:
    SENT.append(to)
    return f"sent to {to}"


SEND = Tool(name="send_email", description="Send an email.", function=_send,
            runtime={"requires_approval": True})
SCRIPT = [{"tool_calls": [{"id": "c1", "name": "send_email", "parameters": {"to": "ada"}}]},
          {"content": "done"}]


class Approver:
    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    @hookimpl
    def confirm_continuation(self, budget: Any, context: dict[str, Any]) -> bool | None:
        self.asked.append(context)
        return self.answer


@pytest.mark.parametrize(("answer", "runs", "why"), [
    (True, 1, None), (False, 0, "was declined"), (None, 0, "nobody approved it")])
def test_an_approval_tool_runs_only_when_approved(answer: bool | None, runs: int,
                                                  why: str | None) -> None:
    SENT.clear()
    approver = Approver(answer)
    with bootstrap.boot(":memory:", plugins=[approver], load_entrypoints=False) as host:
        result = host.run_conversation([{"role": "user", "content": "mail ada"}], [SEND],
                                       "scripted", "m", payload={"script": SCRIPT})
    assert result.status == "completed"
    assert len(SENT) == runs
    [asked] = approver.asked
    assert asked["kind"] == "tool_approval"
    assert asked["tool_call"] == {"id": "c1", "name": "send_email", "parameters": {"to": "ada"}}
    refused = [m for m in result.messages if m.type == "tool_result"
               and m.payload.get("error_type") == "approval_declined"]
    if why is None:
        assert refused == []
        assert result.tool_execution_results[0]["result"]["result"] == "sent to ada"
    else:
        assert why in str(refused[0].content)
        assert result.tool_execution_results == []  # refused, never run


def test_requires_approval_must_be_a_boolean() -> None:
    from datamachine.errors import InvalidToolDefinition

    with pytest.raises(InvalidToolDefinition, match="requires_approval must be true or false"):
        Tool(name="x", function=_send, runtime={"requires_approval": "yes"})
