"""host.achat and host.acontinue_conversation: the chat and continuation rules, awaited."""

from __future__ import annotations

import asyncio

import bootstrap
import datamachine
from datamachine.host import Host


def test_achat_keeps_a_session_and_acontinue_resumes_a_stopped_run(tmp_path: object) -> None:
    async def scenario(host: Host) -> tuple[str, str, int, str]:
        session = host.chat_sessions.create()
        first = await host.achat(session.id, "hello")
        second = await host.achat(session.id, "again")
        stopped = await host.arun_conversation(
            [{"role": "user", "content": "go"}], [], "scripted", "m", max_turns=1,
            payload={"script": [{"tool_calls": [{"name": "nothing", "parameters": {}}]},
                                {"content": "done now"}], "final_summary": False})
        assert stopped.status == "budget_exceeded"
        assert stopped.transcript_session_id is not None
        resumed = await host.acontinue_conversation(stopped.transcript_session_id, 2)
        return (first.final_content, second.final_content,
                host.chat_sessions.get(session.id).turn_count, resumed.status)

    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        first, second, turns, resumed = asyncio.run(scenario(host))
    assert (first, second, turns) == ("echo: hello", "echo: again", 2)
    assert resumed == "completed"


def test_module_level_acontinue_conversation_uses_the_default_host() -> None:
    from datamachine.api import reset_default_host

    reset_default_host()
    try:
        stopped = datamachine.run_conversation(
            [{"role": "user", "content": "go"}], provider="scripted", model="m", max_turns=1,
            payload={"script": [{"tool_calls": [{"name": "x", "parameters": {}}]},
                                {"content": "finished"}], "final_summary": False})
        assert stopped.transcript_session_id is not None
        resumed = asyncio.run(datamachine.acontinue_conversation(
            stopped.transcript_session_id, 1))
        # The continuation runs without the first run's script: the scripted provider echoes.
        assert (resumed.status, resumed.final_content) == ("completed", "echo: go")
    finally:
        reset_default_host()


def test_a_run_stopped_at_a_chat_limit_never_reports_an_earlier_runs_answer() -> None:
    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        session = host.chat_sessions.create(max_turns=2)
        first = host.chat(session.id, "hello",
                          payload={"script": [{"content": "The first answer."}]})
        assert first.final_content == "The first answer."
        second = host.chat(session.id, "now call a tool", payload={"script": [
            {"content": "", "tool_calls": [{"name": "lookup", "parameters": {"q": 1}}]}]})
    assert second.status == "aborted"
    # Before: "The first answer.", the previous run's reply shown as this question's answer.
    assert second.final_content != "The first answer."
    assert "The first answer." not in second.final_content
