"""``datamachine settings`` after a review: secrets in values of the wrong shape, masks that came
back through ``set``, values too deep or too large for their checks, and output that must stay
standard JSON. Real subprocesses with an explicit environment."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

TOKEN = "dm_SECRETTOKEN_abcdef"
API_KEY = "sk-live-0123456789abcdef"


def _cli(db: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("DATAMACHINE_") and not key.endswith("_API_KEY")}
    environ.update({"DATAMACHINE_DB": str(db), "DATAMACHINE_LOAD_PLUGINS": "", **env})
    return subprocess.run([sys.executable, "-m", "datamachine", *args], capture_output=True,
                          text=True, env=environ, timeout=60, check=False, input="")


def _store_raw(db: Path, key: str, text: str) -> None:
    """Write ``text`` as the stored value of ``key`` around ``settings set`` (by hand)."""
    assert _cli(db, "settings", "get", "max_turns").returncode == 0  # the database exists
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT OR REPLACE INTO settings (key, value, updated_at) VALUES (?, ?, 0)",
                     [key, text])
    conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "d.db"


# -- 1. secrets in a value of the wrong shape ----------------------------------------------------


def test_a_secret_setting_read_as_text_is_masked_whole_everywhere(db: Path) -> None:
    # A trailing comma: the environment's text is no JSON, so remote_sites held the text, and
    # `settings get`, `show --json` and `list` printed the token in it.
    env = {"DATAMACHINE_REMOTE_SITES":
           '{"a":{"token":"' + TOKEN + '","url":"http://x"},}'}
    for args in (["get", "remote_sites"], ["show", "remote_sites"],
                 ["show", "remote_sites", "--json"], ["list"], ["list", "--json"]):
        done = _cli(db, "settings", *args, **env)
        assert done.returncode == 0, (args, done.stderr)
        assert "SECRETTOKEN" not in done.stdout + done.stderr, args
    assert json.loads(_cli(db, "settings", "get", "remote_sites", **env).stdout) == "****"
    revealed = _cli(db, "settings", "get", "remote_sites", "--reveal", **env)
    assert TOKEN in json.loads(revealed.stdout)


def test_mcp_servers_stored_as_a_json_string_is_masked_whole(db: Path) -> None:
    inner = json.dumps({"s": {"command": ["server"], "env": {"API_KEY": API_KEY}}})
    _store_raw(db, "mcp_servers", json.dumps(inner))
    for args in (["get", "mcp_servers"], ["show", "mcp_servers", "--json"], ["list"],
                 ["list", "--json"]):
        done = _cli(db, "settings", *args, DATAMACHINE_LOAD_PLUGINS="mcp")
        assert done.returncode == 0, (args, done.stderr)
        assert API_KEY not in done.stdout + done.stderr, args
        assert "mcp_servers" in done.stdout + done.stderr, args  # the plugin is loaded


def test_a_value_with_a_problem_is_masked_whole(db: Path) -> None:
    # A misspelt field ("tokn") is no secret field, but it holds the token all the same.
    sites = json.dumps({"a": {"url": "http://x", "tokn": TOKEN}})
    done = _cli(db, "settings", "list", "--json", DATAMACHINE_REMOTE_SITES=sites)
    assert done.returncode == 0, done.stderr
    row = {row["key"]: row for row in json.loads(done.stdout)}["remote_sites"]
    assert row["problem"]
    assert row["value"] == {"a": {"url": "****", "tokn": "****cdef"}}
    assert TOKEN not in done.stdout + done.stderr


def test_a_corrupt_stored_value_is_named_without_echoing_its_text(db: Path) -> None:
    _store_raw(db, "providers", '{"x":{"headers":{"A":"' + API_KEY + '"}}')  # one } short
    ran = _cli(db, "run", "hi")
    assert ran.returncode == 1
    assert API_KEY[:8] not in ran.stdout + ran.stderr
    assert "'providers' is not JSON" in ran.stderr
    assert "datamachine settings unset providers" in ran.stderr
    listed = _cli(db, "settings", "list")
    assert listed.returncode == 0
    assert API_KEY[:8] not in listed.stdout + listed.stderr
    assert "'providers' is not JSON" in listed.stderr


# -- 2. a mask is never stored -------------------------------------------------------------------


def test_get_piped_into_set_is_refused_instead_of_storing_the_mask(db: Path) -> None:
    sites = json.dumps({"a": {"url": "http://x", "token": TOKEN}})
    assert _cli(db, "settings", "set", "remote_sites", sites).returncode == 0
    shown = _cli(db, "settings", "get", "remote_sites")
    assert json.loads(shown.stdout)["a"]["token"] == "****cdef"
    again = _cli(db, "settings", "set", "remote_sites", shown.stdout)
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1  # one line, no traceback
    assert "'****cdef'" in again.stderr
    assert "datamachine settings get remote_sites --reveal" in again.stderr
    revealed = _cli(db, "settings", "get", "remote_sites", "--reveal")
    assert json.loads(revealed.stdout)["a"]["token"] == TOKEN  # the real token stays
    assert _cli(db, "settings", "set", "remote_sites", revealed.stdout).returncode == 0


# -- 4. a value too large or too deep for its check ----------------------------------------------

HUGE = "1" + "0" * 400


@pytest.mark.parametrize(("key", "plugins", "says"), [
    ("remote_agent_timeout", "", "finite positive number of seconds"),
    ("mcp_call_timeout", "mcp", "at most 3,600"),
    ("request_timeout", "", "finite non-negative number of seconds"),
])
def test_a_400_digit_number_is_refused_in_one_line(db: Path, key: str, plugins: str,
                                                   says: str) -> None:
    done = _cli(db, "settings", "set", key, HUGE, DATAMACHINE_LOAD_PLUGINS=plugins)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: ")
    assert done.stderr.count("\n") == 1
    assert says in done.stderr
    assert "an integer of about 401 digits" in done.stderr


DEEP = "[" * 5000 + "]" * 5000


def test_json_nested_too_deep_on_the_command_line_is_a_one_line_usage_error(db: Path) -> None:
    for args in (["settings", "set", "max_turns", DEEP], ["settings", "set", "x_mine", DEEP],
                 ["settings", "set", "model_options", '{"stop": ' + DEEP + "}"],
                 ["run", "-o", "stop", DEEP, "hi"]):
        done = _cli(db, *args)
        assert done.returncode == 2, (args[:3], done.stderr[-300:])
        assert "Traceback" not in done.stderr
        assert "JSON nested more than 100 levels deep" in done.stderr, args[:3]
    assert "-o stop" in _cli(db, "run", "-o", "stop", DEEP, "hi").stderr
    assert _cli(db, "settings", "get", "x_mine").stdout == "null\n"  # nothing was stored


def test_json_nested_too_deep_in_the_environment_is_a_listed_problem(db: Path) -> None:
    env = {"DATAMACHINE_MODEL_OPTIONS": DEEP}
    listed = _cli(db, "settings", "list", **env)
    assert listed.returncode == 0, listed.stderr[-300:]
    assert "model_options: Setting 'model_options' is JSON nested more than 100" in listed.stderr
    assert "DATAMACHINE_MODEL_OPTIONS" in listed.stderr
    ran = _cli(db, "run", "hi", **env)
    assert ran.returncode == 1
    assert ran.stderr.startswith("Error: Setting 'model_options' is JSON nested")
    assert ran.stderr.count("\n") == 1


@pytest.mark.parametrize("depth", [5000, 500])  # json.loads fails; pydantic cannot write it
def test_a_stored_value_nested_too_deep_is_listed_and_set_or_unset_repairs_it(
        db: Path, depth: int) -> None:
    deep = '{"stop": ' + "[" * depth + "]" * depth + "}"
    _store_raw(db, "model_options", deep)
    for args in (["settings", "list"], ["settings", "list", "--json"],
                 ["settings", "show", "model_options"]):
        done = _cli(db, *args)
        assert done.returncode == 0, (args, done.stderr[-300:])
        assert "The stored value of setting 'model_options' is JSON nested more than 100" in (
            done.stdout + done.stderr)
    ran = _cli(db, "run", "hi")
    assert ran.returncode == 1
    assert ran.stderr.startswith("Error: The stored value of setting 'model_options'")
    assert "datamachine settings unset model_options" in ran.stderr
    assert _cli(db, "settings", "set", "model_options", '{"temperature": 0.2}').returncode == 0
    assert _cli(db, "run", "hi").returncode == 0
    _store_raw(db, "model_options", deep)
    assert "removed" in _cli(db, "settings", "unset", "model_options").stdout
    assert _cli(db, "run", "hi").returncode == 0


# -- 5. --json is standard JSON ------------------------------------------------------------------


def _strict(text: str) -> Any:
    def refuse(constant: str) -> object:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_json_output_writes_a_number_json_cannot_spell_as_null(db: Path, number: str) -> None:
    env = {"DATAMACHINE_MAX_RUN_SECONDS": number}
    listed = _cli(db, "settings", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    rows = {row["key"]: row for row in _strict(listed.stdout)}
    assert (rows["max_run_seconds"]["value"], rows["max_run_seconds"]["source"]) == (None, "env")
    assert rows["max_run_seconds"]["problem"]
    shown = _cli(db, "settings", "show", "max_run_seconds", "--json", **env)
    assert _strict(shown.stdout)["value"] is None
    got = _cli(db, "settings", "get", "max_run_seconds", **env)
    assert (got.stdout, got.returncode) == ("null\n", 0)
    assert "finite positive number" in got.stderr  # the problem, as a warning


# -- 6. show refuses a typo as get does ----------------------------------------------------------


def test_show_refuses_an_unknown_key_naming_the_closest_as_get_does(db: Path) -> None:
    for command in ("show", "get"):
        done = _cli(db, "settings", command, "max_trns")
        assert done.returncode == 2, command
        assert "Unknown setting 'max_trns'; did you mean 'max_turns'?" in done.stderr, command
        assert done.stdout == ""
    assert _cli(db, "settings", "show", "max_trns", "--json").returncode == 2
    free = _cli(db, "settings", "show", "x_theme")  # free-form: shown, set or not
    assert (free.returncode, "(undeclared)" in free.stdout) == (0, True)
    _store_raw(db, "left_behind", '"by a removed plugin"')
    stored = _cli(db, "settings", "show", "left_behind", "--json")
    assert stored.returncode == 0
    assert json.loads(stored.stdout)["value"] == "by a removed plugin"
    from_env = _cli(db, "settings", "show", "from_env", DATAMACHINE_FROM_ENV="1")
    assert from_env.returncode == 0


# -- 7. unset removes every stored key list names ------------------------------------------------


def test_unset_removes_a_hand_stored_key_that_set_would_refuse(db: Path) -> None:
    _store_raw(db, "Bad Key", "1")
    listed = _cli(db, "settings", "list")
    assert "declared by nobody here (a removed plugin?): Bad Key;" in listed.stderr
    removed = _cli(db, "settings", "unset", "Bad Key")
    assert (removed.returncode, removed.stdout, removed.stderr) == (0, "Bad Key removed\n", "")
    assert "Bad Key" not in _cli(db, "settings", "list").stderr
    again = _cli(db, "settings", "unset", "Bad Key")  # not stored: refused as a key again
    assert again.returncode == 2
    assert "must be a string of lowercase letters" in again.stderr


# -- 8. keys whole on a terminal -----------------------------------------------------------------


def test_settings_list_on_an_80_column_terminal_prints_every_key_whole(db: Path) -> None:
    keys = [row["key"] for row in json.loads(_cli(db, "settings", "list", "--json").stdout)]
    assert "allow_model_requests" in keys
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("DATAMACHINE_") and not key.endswith("_API_KEY")}
    environ.update({"DATAMACHINE_DB": str(db), "DATAMACHINE_LOAD_PLUGINS": "", "TERM": "xterm",
                    "COLUMNS": "80"})
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "settings", "list"],
                          encoding="utf-8", timeout=60, dimensions=(60, 80), env=environ)
    child.expect(pexpect.EOF)
    child.close()
    out = re.sub(r"\x1b\[[0-9;]*m", "", child.before or "")
    assert child.exitstatus == 0, out
    lines = out.splitlines()
    assert "───" in out  # drawn by rich, as on a terminal
    assert all(len(line) <= 80 for line in lines), out
    firsts = {line.split()[0] for line in lines[2:] if line.strip()}
    assert set(keys) <= firsts, sorted(set(keys) - firsts)
    assert "…" in out  # what gave way was another column (the remote_agent plugin's owner)
