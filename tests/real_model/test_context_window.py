"""A real model with a small context window (DESIGN.md 21): SmolLM2-135M on llama-cpp-python's
server started with ``--n_ctx 1024``. A 30-turn tool loop outgrows the window and finishes
without an overflow error, with compactions recorded; the window is learned from the server's
own "maximum context length" answer (none is configured).

What grows here is not the tool results: llama-cpp-python's ``chatml-function-calling`` template
leaves ``tool`` messages out of the prompt, so what fills the window is the system message and
the assistant's calls, turn after turn. The run does not know that: it learns the window and
its tokens per byte from the server's answers, and compacts until the server takes the
request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import bootstrap
import datamachine
from datamachine.host import Host

pytestmark = pytest.mark.real_model


@datamachine.tool
def read_page(n: int) -> str:
    """Read page ``n`` of the manual.

    Args:
        n: The page number.
    """
    return f"Page {n} of the manual. " + "The valve must be closed before service. " * 30


# About 600 of the window's 1,024 tokens, so thirty turns of calls do not fit beside it.
SYSTEM = ("You are a careful technician who reads service manuals. Read every page you are "
          "asked to read, one call at a time, and keep notes of every valve, pump and pressure "
          "setting you find. ") * 12
FORCED = {"tool_choice": {"type": "function", "function": {"name": "read_page"}},
          "temperature": 0, "max_tokens": 64}


@pytest.fixture
def host(smollm2_small_url: str) -> Iterator[Host]:
    booted = bootstrap.boot(db_path=":memory:", load_entrypoints=False)
    booted.settings.set("openai_base_url", smollm2_small_url)
    booted.settings.set("request_timeout", 120)
    booted.settings.set("max_tool_calls", 100)
    try:
        yield booted
    finally:
        booted.close()


def test_a_30_turn_tool_loop_fits_a_1024_token_window(host: Host) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    result = host.run_conversation(
        [{"role": "system", "content": SYSTEM},
         {"role": "user", "content": "Read the manual page by page."}], [read_page], "openai",
        "smollm2", max_turns=30, mode="chat",
        payload={"model_options": FORCED,
                 "event_sink": lambda name, data: events.append((name, data))})

    # Forced to call the tool on every turn, the model never answers on its own: the turn
    # budget stops it, with a summary that fits the window. Never the server's 400.
    assert result.status == "budget_exceeded", (result.error, result.warning)
    assert result.budget == "conversation_turns"
    assert result.turn_count == 30
    assert result.error_code is None
    assert result.final_content
    assert result.compactions > 0
    assert result.budgets["context_tokens"]["ceiling"] <= 1024
    overflows = [data for name, data in events if name == "context_overflow"]
    assert len(overflows) <= 2  # the window is learned once, then kept
    assert sum(1 for m in result.messages if m.type == "tool_result") == 30
