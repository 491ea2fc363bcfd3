"""``datamachine resolve SESSION CALL_ID RESULT``: a person says what a call in doubt did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import bootstrap
from datamachine.cli import cli
from tests.exactly_once.crash_tools import CRASH, LEDGER, TOOLS, Crash, Planner


def _died_mid_send(db: Path) -> str:
    """A run on ``db`` that died right after its send's side effect; the call's id."""
    LEDGER.clear()
    CRASH["after_effect"] = True
    plan = [[{"name": "send", "parameters": {"to": "ada"}}]]
    with bootstrap.boot(str(db), plugins=[Planner(plan)], load_entrypoints=False) as host:
        with pytest.raises(Crash):
            host.run_conversation([{"role": "user", "content": "mail ada"}], TOOLS,
                                  "scripted", "m", payload={"transcript_session_id": "s1"})
        [intent] = host.transcripts.unsettled_intents("s1")
    return intent.call_id


def test_resolve_settles_the_call_and_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    call_id = _died_mid_send(db)
    script = tmp_path / "answer.json"
    script.write_text(json.dumps([{"content": "the mail went out"}]))
    runner = CliRunner()
    result = runner.invoke(cli, ["--db", str(db), "resolve", "s1", call_id,
                                 '{"success": true, "result": "sent at 10:02"}',
                                 "--script", str(script), "--json"])
    assert result.exit_code == 0, result.output
    answered = json.loads(result.output)
    assert answered["status"] == "completed"
    assert answered["final_content"] == "the mail went out"
    [told] = [m["payload"] for m in answered["messages"] if m["type"] == "tool_result"]
    assert (told["result"], told["resolved"]) == ("sent at 10:02", True)
    assert len(LEDGER) == 1  # never run again

    again = runner.invoke(cli, ["--db", str(db), "resolve", "s1", call_id, "sent"])
    assert again.exit_code == 1
    assert f"Call {call_id!r} of session 's1' is not in doubt" in again.output


def test_resolve_refuses_result_that_looks_like_json_but_is_not(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    call_id = _died_mid_send(db)
    result = CliRunner().invoke(cli, ["--db", str(db), "resolve", "s1", call_id, "{sent"])
    assert result.exit_code == 2
    assert "RESULT looks like JSON but is not" in result.output
