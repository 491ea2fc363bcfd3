"""Settings and command-line input that used to be taken, refused (or warned about) with the
fix (issue 39): a base URL that is no URL, a misspelt variable, ``settings unset`` of a key
nobody declares, a bare number as the default model, contradicting ``run`` flags."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import bootstrap
from datamachine.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def invoke(db: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = CliRunner().invoke(cli, ["--db", str(db), *args], env=env)
    return done.exit_code, done.stdout, done.stderr


def transcripts(db: Path) -> int:
    if not db.exists():
        return 0
    with bootstrap.boot(db, load_entrypoints=False) as host:
        return len(host.transcripts.list())


@pytest.mark.parametrize("bad", ["not a url", "ftp://example.com/v1", "http://",
                                 "http://127.0.0.1:8080/v1?key=1", "localhost:11434/v1"])
def test_settings_set_refuses_a_base_url_that_is_no_http_url(tmp_path: Path, bad: str) -> None:
    code, _, err = invoke(tmp_path / "s.db", "settings", "set", "openai_base_url", bad)
    assert code == 2
    assert "Setting 'openai_base_url' must be an http(s) base URL such as" in err
    code, out, _ = invoke(tmp_path / "s.db", "settings", "set", "openai_base_url",
                          "http://127.0.0.1:11434/v1")
    assert (code, out) == (0, 'openai_base_url = "http://127.0.0.1:11434/v1"\n')


def test_run_and_chat_warn_about_a_variable_that_names_no_setting(tmp_path: Path) -> None:
    env = {"DATAMACHINE_MAX_TRUNS": "3"}
    code, out, err = invoke(tmp_path / "s.db", "run", "hi", env=env)
    assert (code, out) == (0, "echo: hi\n")
    assert err == ("Warning: DATAMACHINE_MAX_TRUNS is set, but no setting 'max_truns' is "
                   "declared, so nothing reads it (did you mean DATAMACHINE_MAX_TURNS?).\n")
    code, _, err = invoke(tmp_path / "s.db", "chat", env=env)
    assert code == 0
    assert "DATAMACHINE_MAX_TRUNS is set" in err


def test_settings_unset_of_a_key_nobody_declares_exits_2_like_get(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    for command in ("get", "unset"):
        code, _, err = invoke(db, "settings", command, "max_trns")
        assert code == 2, command
        assert "Unknown setting 'max_trns'; did you mean 'max_turns'?" in err
    assert invoke(db, "settings", "unset", "max_turns")[:2] == (0, "max_turns was not set\n")
    assert invoke(db, "settings", "unset", "x_mine")[:2] == (0, "x_mine was not set\n")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_serve_refuses_a_bare_number_as_the_default_model_naming_the_variable(
        tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "datamachine", "--db", str(tmp_path / "s.db"), "serve",
         "--port", str(_free_port())], capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DATAMACHINE_LOAD_PLUGINS": "",
             "DATAMACHINE_DEFAULT_MODEL": "123"})
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("Error: Setting 'default_model' cannot be used:")
    assert "must be a model id such as 'gpt-4o-mini'" in line
    assert "(from the environment variable DATAMACHINE_DEFAULT_MODEL: correct it there, or " \
           "unset it)." in line
    assert "Uvicorn running" not in done.stdout + done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--tools", ",,,"), "--tools ',,,' has an empty name"),
    (("--tools", "call_remote_agent,,"), "has an empty name"),
    (("--single-turn", "--max-turns", "3"), "--single-turn stops after one provider turn"),
])
def test_run_flags_that_say_nothing_or_contradict_are_usage_errors(
        tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    code, out, err = invoke(tmp_path / "r.db", "run", *args, "hi")
    assert code == 2
    assert out == ""
    assert message in err
    assert transcripts(tmp_path / "r.db") == 0
