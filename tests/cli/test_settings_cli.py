"""``datamachine settings`` through real subprocesses: declared keys, defaults, sources, secrets,
and a database holding a bad value that every settings command still handles."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "dm_abcdefghijklmnopqrstuvwxyz0123"


def dm(db: Path, *args: str, env: dict[str, str] | None = None,
       ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "datamachine", "--db", str(db), "settings",
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})


def listed(db: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, dict[str, object]]:
    done = dm(db, "list", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    return {row["key"]: row for row in json.loads(done.stdout)}


def test_an_unknown_key_is_refused_naming_the_closest_and_nothing_is_stored(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    done = dm(db, "set", "max_trns", "40")
    assert done.returncode == 2
    assert "Unknown setting 'max_trns'; did you mean 'max_turns'?" in done.stderr
    assert "datamachine settings list" in done.stderr
    assert "max_trns" not in listed(db)
    refused = dm(db, "get", "max_trns")
    assert refused.returncode == 2
    assert "did you mean 'max_turns'?" in refused.stderr


def test_get_prints_the_value_in_effect_and_only_that(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    fresh = dm(db, "get", "max_turns")
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (0, "25\n", "")
    assert dm(db, "get", "default_provider").stdout == '"scripted"\n'
    assert dm(db, "set", "max_turns", "40").stdout == "max_turns = 40\n"
    assert dm(db, "get", "max_turns").stdout == "40\n"
    assert dm(db, "get", "max_turns", env={"DATAMACHINE_MAX_TURNS": "30"}).stdout == "30\n"
    assert "removed" in dm(db, "unset", "max_turns").stdout
    assert dm(db, "get", "max_turns").stdout == "25\n"


def test_list_shows_every_setting_with_default_value_source_and_owner(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert dm(db, "set", "default_model", "gpt-4o").returncode == 0
    rows = listed(db, env={"DATAMACHINE_REQUEST_TIMEOUT": "60"})
    assert {"max_turns", "request_timeout", "remote_sites", "fetch_allow_private",
            "allow_model_requests", "site_id"} <= set(rows)
    assert {k: rows["max_turns"][k] for k in ("value", "default", "source", "owner")} == {
        "value": 25, "default": 25, "source": "default", "owner": "core"}
    assert (rows["default_model"]["value"], rows["default_model"]["source"]) == ("gpt-4o", "db")
    assert (rows["request_timeout"]["value"], rows["request_timeout"]["source"]) == (60, "env")
    assert rows["fetch_allow_private"]["owner"] == "fetch"
    table = dm(db, "list")
    assert table.returncode == 0
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["key", "value", "default", "source", "owner"]
    assert any(line.split()[:5] == ["max_turns", "25", "25", "default", "core"]
               for line in lines)


def test_values_are_read_by_the_declared_type(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert dm(db, "set", "site_id", "1234").stdout == 'site_id = "1234"\n'
    assert dm(db, "set", "budget_pressure", "True").stdout == "budget_pressure = true\n"
    assert dm(db, "set", "chat_max_turns", "unlimited").stdout == 'chat_max_turns = "unlimited"\n'
    assert dm(db, "set", "chat_tools", '["call_remote_agent"]').returncode == 0
    assert dm(db, "set", "x_my_app", "plain words").stdout == 'x_my_app = "plain words"\n'
    null = dm(db, "set", "default_model", "null")  # not the word "null" as a model name
    assert null.returncode == 2
    assert "datamachine settings unset default_model" in null.stderr
    assert dm(db, "set", "chat_tools", "null").stdout == "chat_tools = null\n"


@pytest.mark.parametrize(("key", "value", "says"), [
    ("max_run_seconds", "NaN", "finite positive number of seconds"),
    ("request_timeout", "inf", "finite non-negative number of seconds"),
    ("request_timeout", "Infinity", "finite non-negative number of seconds"),
    ("max_turns", "ten", "positive integer between 1 and 10,000"),
    ("site_id", '"my site"', "must be 1-64 letters, digits"),
    ("budget_pressure", "maybe", "true or false"),
])
def test_bad_values_are_refused_saying_what_fits(tmp_path: Path, key: str, value: str,
                                                 says: str) -> None:
    done = dm(tmp_path / "s.db", "set", key, value)
    assert done.returncode == 2
    assert key in done.stderr
    assert says in done.stderr


def test_secret_values_are_masked_unless_revealed(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    sites = json.dumps({"b": {"url": "http://127.0.0.1:1", "token": TOKEN}})
    stored = dm(db, "set", "remote_sites", sites)
    assert stored.returncode == 0
    assert TOKEN not in stored.stdout
    for args in (["list"], ["list", "--json"], ["get", "remote_sites"],
                 ["show", "remote_sites"]):
        done = dm(db, *args)
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout + done.stderr, args
        assert "****0123" in done.stdout, args
    assert json.loads(dm(db, "get", "remote_sites", "--reveal").stdout)["b"]["token"] == TOKEN


def _store_raw(db: Path, key: str, text: str) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE settings SET value = ? WHERE key = ?", [text, key])
        if conn.total_changes == 0:
            conn.execute("INSERT INTO settings (key, value, updated_at) VALUES (?, ?, 0)",
                         [key, text])
    conn.close()


@pytest.mark.parametrize("text", ['"my site"', "not json"])
def test_a_hand_corrupted_site_id_leaves_every_settings_command_working(tmp_path: Path,
                                                                       text: str) -> None:
    db = tmp_path / "s.db"
    assert dm(db, "get", "site_id").returncode == 0  # the first boot stores a good one
    _store_raw(db, "site_id", text)
    _store_raw(db, "left_behind", '"by a removed plugin"')

    table = dm(db, "list")
    assert table.returncode == 0, table.stderr
    assert "site_id" in table.stderr  # named among the problems, with the fix
    assert "datamachine settings set site_id" in table.stderr
    assert "left_behind" in table.stderr  # stored, declared by nobody
    rows = listed(db)
    assert rows["site_id"]["problem"]
    assert (rows["left_behind"]["declared"], rows["left_behind"]["owner"]) == (False, None)
    assert dm(db, "show", "site_id").returncode == 0
    assert dm(db, "get", "max_turns").stdout == "25\n"
    assert dm(db, "set", "max_turns", "30").returncode == 0
    assert "removed" in dm(db, "unset", "left_behind").stdout

    fixed = dm(db, "set", "site_id", "ok-id")
    assert (fixed.returncode, fixed.stdout) == (0, 'site_id = "ok-id"\n')
    after = listed(db)
    assert [key for key, row in after.items() if row["problem"]] == []
    assert after["site_id"]["value"] == "ok-id"
    assert "left_behind" not in after


def test_a_corrupted_site_id_can_also_be_unset_and_one_is_generated_again(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    assert dm(db, "get", "site_id").returncode == 0
    _store_raw(db, "site_id", "not json")
    unreadable = dm(db, "get", "site_id")
    assert unreadable.returncode == 1
    assert "not JSON" in unreadable.stderr
    assert "removed" in dm(db, "unset", "site_id").stdout
    fresh = json.loads(dm(db, "get", "site_id").stdout)
    assert isinstance(fresh, str)
    assert len(fresh) == 32


def test_an_environment_override_is_shown_with_source_env_and_noted_on_set(
        tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    env = {"DATAMACHINE_MAX_TURNS": "30", "DATAMACHINE_SITE_ID": "site-from-env",
           "DATAMACHINE_SOMETHING_ELSE": "ignored"}
    rows = listed(db, env=env)
    assert (rows["max_turns"]["value"], rows["max_turns"]["source"]) == (30, "env")
    assert (rows["site_id"]["value"], rows["site_id"]["source"]) == ("site-from-env", "env")
    assert rows["something_else"]["declared"] is False
    done = dm(db, "set", "max_turns", "40", env=env)
    assert done.returncode == 0
    assert "DATAMACHINE_MAX_TURNS is set and overrides the stored value" in done.stderr
