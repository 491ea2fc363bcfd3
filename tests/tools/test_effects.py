"""What a tool does to the world (DESIGN 24): ``effects`` declared on the tool, checked when
it is defined, and the idempotency key a call hands downstream."""

from __future__ import annotations

from typing import Any

import pytest

import bootstrap
from datamachine import InvalidToolDefinition, Tool, ToolContext, UsageError, tool
from datamachine.tools.context import ToolContext as ContextClass


def _send(to: str) -> str:
    return f"sent to {to}"


def test_effects_default_to_read_and_are_declared_either_way() -> None:
    @tool
    def look(q: str) -> str:
        """Look.

        Args:
            q: What.
        """
        return q

    @tool(effects="write")
    def send(to: str) -> str:
        """Send.

        Args:
            to: Whom.
        """
        return to

    built = Tool(name="charge", function=_send, runtime={"effects": "idempotent"},
                 parameters={"type": "object", "properties": {"to": {"type": "string"}}})
    assert (look.effects, send.effects, built.effects) == ("read", "write", "idempotent")
    assert send.runtime["effects"] == "write"


@pytest.mark.parametrize("bad", ["sometimes", "WRITE", 1, ["write"]])
def test_an_unknown_effect_is_refused_at_definition_naming_the_three(bad: Any) -> None:
    with pytest.raises(InvalidToolDefinition) as raised:
        tool(effects=bad)(_send)
    message = str(raised.value)
    assert "effects" in message
    assert all(word in message for word in ("'read'", "'idempotent'", "'write'"))
    assert isinstance(raised.value, UsageError)
    with pytest.raises(InvalidToolDefinition, match="effects"):
        Tool(name="x", function=_send, runtime={"effects": bad})


def _context(session: str | None, turn: int, call_id: str, name: str = "send") -> ToolContext:
    return ContextClass(payload={}, mode="chat", turn=turn, engine_data={}, budgets={},
                        budget_factory=lambda n: None,  # type: ignore[arg-type,return-value]
                        tool_name=name, tool_call_id=call_id, session_id=session)


def test_the_idempotency_key_is_one_per_call_and_the_same_for_each_attempt() -> None:
    key = _context("s1", 2, "call-1").idempotency_key
    assert key.startswith("dm-")
    assert len(key) > 10
    assert _context("s1", 2, "call-1").idempotency_key == key  # the same call, asked again
    others = {_context("s1", 2, "call-2").idempotency_key,
              _context("s1", 3, "call-1").idempotency_key,
              _context("s2", 2, "call-1").idempotency_key,
              _context("s1", 2, "call-1", "other").idempotency_key}
    assert key not in others
    assert len(others) == 4
    assert _context(None, 1, "").idempotency_key  # never empty, even without a session


def test_a_tool_reads_its_key_in_a_run_one_key_per_call() -> None:
    seen: list[str] = []

    @tool(effects="idempotent")
    def charge(amount: int, context: ToolContext) -> str:
        """Charge a card.

        Args:
            amount: Cents.
        """
        seen.append(context.idempotency_key)
        return "charged"

    script = [{"tool_calls": [{"id": "c1", "name": "charge", "parameters": {"amount": 5}},
                              {"id": "c2", "name": "charge", "parameters": {"amount": 7}}]},
              {"content": "Done."}]
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        result = host.run_conversation([{"role": "user", "content": "pay"}], [charge],
                                       "scripted", "m", payload={"script": script})
        stored = host.db.conn.execute(
            "SELECT idempotency_key, state FROM tool_intents ORDER BY seq").fetchall()
    assert result.status == "completed"
    assert len(set(seen)) == len(seen) == 2
    # The key each call saw is the one its intent stored before it ran (and settled).
    assert [tuple(row) for row in stored] == [(seen[0], "settled"), (seen[1], "settled")]
