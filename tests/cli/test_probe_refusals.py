"""Command-line input a probe of the commands found taken too late, with a traceback, or
with a message naming the wrong flag; each test failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import bootstrap
from datamachine.cli import cli

REPEATING = [{"tool_calls": [{"name": "lookup", "parameters": {"q": "x"}}]}] * 6


def invoke(db: Path, *args: str, env: dict[str, str] | None = None,
           stdin: str | None = None) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["--db", str(db), *args], env=env, input=stdin)
    return done.exit_code, done.stdout, done.stderr


def stored(db: Path) -> tuple[int, int]:
    """(transcripts, chat sessions) in the database."""
    if not db.exists():
        return (0, 0)
    with bootstrap.boot(db, load_entrypoints=False) as host:
        return len(host.transcripts.list()), len(host.chat_sessions.list())


def test_a_bad_stuck_turns_variable_is_refused_before_the_run_not_turns_later(
        tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps(REPEATING))
    code, _, err = invoke(tmp_path / "a.db", "run", "go", "--script", str(script),
                          env={"DATAMACHINE_MAX_STUCK_TURNS": "x"})
    assert code == 2
    assert "setting 'max_stuck_turns' must be a positive integer" in err
    assert "Traceback" not in err
    assert stored(tmp_path / "a.db")[0] == 0


def test_a_script_that_is_not_utf8_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_bytes(b"\xff\xfe\x00")
    code, _, err = invoke(tmp_path / "a.db", "run", "hi", "--script", str(script))
    assert code == 2
    assert "is not UTF-8 text" in err
    assert "Traceback" not in err


def test_chat_checks_its_script_before_it_makes_a_session(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text("42")
    code, _, err = invoke(tmp_path / "a.db", "chat", "--script", str(script), stdin="hi\n")
    assert code == 2
    assert "must be a list of responses" in err
    assert stored(tmp_path / "a.db") == (0, 0)


def test_a_misspelt_budget_flag_is_said_even_without_a_report(tmp_path: Path) -> None:
    code, _, err = invoke(tmp_path / "a.db", "run", "hi", "-b", "tool_callz", "3")
    assert code == 0
    assert "no budget is named 'tool_callz'" in err
    assert "did you mean 'tool_calls'?" in err


def test_extend_by_is_named_as_itself(tmp_path: Path) -> None:
    for command in (["continue", "abc"], ["resume", "abc", "--approve"]):
        code, _, err = invoke(tmp_path / "a.db", *command, "--extend-by", "0")
        assert code == 2
        assert "--extend-by must be a positive integer" in err
        assert "--max-turns" not in err


def test_a_model_option_json_cannot_carry_is_refused(tmp_path: Path) -> None:
    code, _, err = invoke(tmp_path / "a.db", "run", "hi", "-o", "temperature", "1e999",
                          "--option-passthrough")
    assert code == 2
    assert "NaN and infinities are not JSON" in err
    assert stored(tmp_path / "a.db")[0] == 0


def test_a_decline_with_extend_by_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = invoke(tmp_path / "a.db", "resume", "abc", "--decline", "--extend-by", "5")
    assert code == 2
    assert "--extend-by goes with --approve" in err


def test_tokens_create_names_its_own_argument_and_refuses_empty_tool_names(
        tmp_path: Path) -> None:
    code, _, err = invoke(tmp_path / "a.db", "tokens", "create", "t1", "--site", "bad site!")
    assert code == 2
    assert "site must be 1-64 letters" in err
    assert "settings set site_id" not in err  # the value is the argument, not the setting
    code, _, err = invoke(tmp_path / "a.db", "tokens", "create", "t2", "--tools", ",,")
    assert code == 2
    assert "has an empty name" in err
    code, _, _ = invoke(tmp_path / "a.db", "tokens", "create", "t3", "--tools", "")
    assert code == 0  # '' still means: no tools


def test_a_negative_budget_flag_is_named_in_the_flags_words(tmp_path: Path) -> None:
    code, _, err = invoke(tmp_path / "a.db", "run", "hi", "-b", "tool_calls", "-1")
    assert code == 2
    assert "--budget tool_calls needs a ceiling of 0 or more" in err
    assert "payload[" not in err
