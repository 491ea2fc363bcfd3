"""``run -c`` / ``run --cid ID``: continue a conversation from the command line, as ``llm -c``
and ``llm --cid`` do (DESIGN.md 25)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pexpect
import pytest
from click.testing import CliRunner

import bootstrap
from datamachine.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def invoke(db: Path, *args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["--db", str(db), *args])
    return done.exit_code, done.stdout, done.stderr


def run_json(db: Path, *args: str) -> dict[str, object]:
    code, out, err = invoke(db, "run", *args, "--json")
    assert code == 0, err
    result: dict[str, object] = json.loads(out)
    return result


def contents(db: Path, session_id: str) -> list[str]:
    with bootstrap.boot(db, load_entrypoints=False) as host:
        return [m["content"] for m in host.transcripts.get(session_id)]


def count(db: Path) -> int:
    with bootstrap.boot(db, load_entrypoints=False) as host:
        return len(host.transcripts.list(limit=100))


def test_continue_goes_on_in_the_same_transcript_with_its_provider_and_model(
        tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = run_json(db, "Name a river.", "-m", "tiny")
    second = run_json(db, "-c", "And another?")
    session = first["transcript_session_id"]
    assert second["transcript_session_id"] == session
    assert second["model"] == "tiny"  # recorded with the transcript, not given again
    assert second["provider"] == "scripted"
    assert (second["turn_count"], second["cumulative_turn_count"]) == (1, 2)
    assert contents(db, str(session)) == ["Name a river.", "echo: Name a river.",
                                          "And another?", "echo: And another?"]
    assert count(db) == 1
    # The model may be changed, as llm -c -m does.
    third = run_json(db, "--continue", "Once more", "-m", "other")
    assert (third["transcript_session_id"], third["model"]) == (session, "other")


def test_continue_picks_the_last_conversation_run_started_not_an_apps_run(
        tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    cli_run = run_json(db, "from the command line")
    with bootstrap.boot(db, load_entrypoints=False) as host:  # an application, later
        host.run_conversation([{"role": "user", "content": "from an app"}], None, "scripted",
                              "m")
        session = host.chat_sessions.create().id
        host.chat(session, "from a chat session")
    again = run_json(db, "-c", "more")
    assert again["transcript_session_id"] == cli_run["transcript_session_id"]


def test_continue_picks_the_most_recently_started_as_llm_does(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    older = run_json(db, "older")
    newer = run_json(db, "newer")
    # --cid brings the older one up to date; -c still means the newest conversation started.
    run_json(db, "--cid", str(older["transcript_session_id"])[:8], "older, again")
    latest = run_json(db, "-c", "which?")
    assert latest["transcript_session_id"] == newer["transcript_session_id"]
    assert contents(db, str(older["transcript_session_id"]))[-2:] == [
        "older, again", "echo: older, again"]


@pytest.mark.parametrize(("cid", "message"), [
    ("zz", "--cid: no transcript id starts with 'zz'"),
    ("ab", "Ambiguous transcript id prefix 'ab'"),
    ("not an id!", "--cid: no transcript id starts with 'not an id!'"),
])
def test_an_unknown_or_ambiguous_cid_is_a_usage_error_and_nothing_runs(
        tmp_path: Path, cid: str, message: str) -> None:
    db = tmp_path / "c.db"
    with bootstrap.boot(db, load_entrypoints=False) as host:
        for session in ("ab1" + "0" * 29, "ab2" + "0" * 29):
            host.run_conversation([{"role": "user", "content": "hi"}], None, "scripted", "m",
                                  payload={"transcript_session_id": session})
    code, out, err = invoke(db, "run", "--cid", cid, "hello")
    assert code == 2
    assert out == ""
    assert message in err
    assert count(db) == 2
    assert all("hello" not in contents(db, s) for s in ("ab1" + "0" * 29, "ab2" + "0" * 29))


def test_what_cannot_be_continued_is_refused_before_anything_runs(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"tool_calls": [{"id": "x", "name": "no",
                                                   "parameters": {}}]}]))
    code, out, err = invoke(db, "run", "go", "--script", str(script), "--max-turns", "1",
                            "--confirmation", "pause", "--json")
    assert code == 4, err
    paused = json.loads(out)["transcript_session_id"]
    stored = contents(db, paused)
    code, _, err = invoke(db, "run", "--cid", paused, "more")
    assert code == 2
    assert f"datamachine resume {paused} --approve" in err

    with bootstrap.boot(db, load_entrypoints=False) as host:
        chat = host.chat_sessions.create().id
        host.chat(chat, "hello")
    code, _, err = invoke(db, "run", "--cid", chat, "more")
    assert code == 2
    assert f"datamachine chat --session {chat}" in err

    code, _, err = invoke(db, "run", "-c", "-s", "Be brief.", "more")
    assert code == 2
    assert "-s/--system starts a conversation" in err
    assert contents(db, paused) == stored


def test_continue_with_nothing_to_continue_starts_a_conversation_and_says_so(
        tmp_path: Path) -> None:
    code, out, err = invoke(tmp_path / "c.db", "run", "-c", "hello")
    assert code == 0
    assert out == "echo: hello\n"
    assert err.startswith("Note: no conversation started by `datamachine run` to continue")


def test_continue_on_a_terminal_streams_and_stores_in_the_same_transcript(
        tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    first = run_json(db, "first")

    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(db), "run", "-c",
                                           "second"],
                          cwd=str(ROOT), encoding="utf-8", timeout=30,
                          env={"PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "120",
                               "HOME": str(tmp_path), "DATAMACHINE_LOAD_PLUGINS": ""})
    child.expect(pexpect.EOF)
    child.close()
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before or "")
    assert child.exitstatus == 0, out
    assert f"transcript:  {first['transcript_session_id']}" in out
    assert contents(db, str(first["transcript_session_id"])) == [
        "first", "echo: first", "second", "echo: second"]
