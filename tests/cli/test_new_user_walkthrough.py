"""What a new user tripped over, following the docs alone, as real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _cli(db: Path, *args: str, stdin: str | None = None,
         **env: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("DATAMACHINE_") and not key.endswith("_API_KEY")}
    environ.update({"DATAMACHINE_DB": str(db), "DATAMACHINE_LOAD_PLUGINS": "", **env})
    return subprocess.run([sys.executable, "-m", "datamachine", *args], capture_output=True,
                          text=True, env=environ, timeout=60, check=False,
                          input=stdin if stdin is not None else "")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "d.db"


def test_script_picks_the_scripted_provider_whatever_the_default(db: Path,
                                                                 tmp_path: Path) -> None:
    # After `settings set default_provider openai`, `run --script s.json` failed with
    # "payload['script'] only applies to the scripted provider, not 'openai'".
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"content": "From the script."}]))
    assert _cli(db, "settings", "set", "default_provider", "openai").returncode == 0
    ran = _cli(db, "run", "hi", "--script", str(script), "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["final_content"] == "From the script."
    both = _cli(db, "run", "hi", "--script", str(script), "--provider", "openai")
    assert both.returncode == 2
    assert "--script" in both.stderr
    assert "--provider openai" in both.stderr


def test_model_and_options_on_the_scripted_fallback_get_the_notice(db: Path) -> None:
    # `run -m llama3.2 -o temperature 0.2` echoed with exit 0 and no word that -m went nowhere.
    asked = _cli(db, "run", "-m", "llama3.2", "hi")
    assert asked.returncode == 0, asked.stderr
    notes = [line for line in asked.stderr.splitlines() if line.startswith("Note:")]
    assert len(notes) == 1
    assert "-m and -o reach no model" in notes[0]
    assert "--provider" in notes[0]
    # An option the scripted provider does not declare is refused (issue 39), naming the way out.
    refused = _cli(db, "run", "-m", "llama3.2", "-o", "temperature", "0.2", "hi")
    assert refused.returncode == 2
    assert "the scripted provider declares no model options" in refused.stderr
    assert "settings set default_provider openai" in refused.stderr
    passed = _cli(db, "run", "-m", "llama3.2", "-o", "temperature", "0.2",
                  "--option-passthrough", "hi")
    assert passed.returncode == 0, passed.stderr
    assert "-m and -o reach no model" in passed.stderr
    plain = _cli(db, "run", "hi")
    assert "Note:" not in plain.stderr


def test_settings_list_piped_prints_long_values_whole_and_set_notes_a_clamp(db: Path) -> None:
    url = "http://127.0.0.1:18765/v1/" + "a" * 80
    assert _cli(db, "settings", "set", "openai_base_url", url).returncode == 0
    listed = _cli(db, "settings", "list")
    assert url in listed.stdout
    clamped = _cli(db, "settings", "set", "max_turns", "500")
    assert clamped.returncode == 0
    assert "max_turns = 500" in clamped.stdout
    assert "runs use 200" in clamped.stderr
    shown = _cli(db, "settings", "show", "max_turns")
    assert "runs use 200" in shown.stdout


def test_load_plugins_takes_plugin_names_and_warns_about_unknown_ones(db: Path) -> None:
    # DATAMACHINE_LOAD_PLUGINS=notes (the name `plugins` shows) loaded nothing, silently.
    by_name = _cli(db, "plugins", "--json", DATAMACHINE_LOAD_PLUGINS="example")
    assert by_name.returncode == 0, by_name.stderr
    assert "example" in [row["name"] for row in json.loads(by_name.stdout)]
    assert by_name.stderr == ""
    unknown = _cli(db, "plugins", DATAMACHINE_LOAD_PLUGINS="notes,example")
    assert unknown.returncode == 0
    [line] = unknown.stderr.splitlines()
    assert "'notes'" in line
    assert "datamachine-example (example)" in line


def test_a_refusal_caused_by_the_environment_says_to_unset_it(db: Path) -> None:
    ran = _cli(db, "run", "hi", "--provider", "openai", "-m", "m", "--json",
               DATAMACHINE_ALLOW_MODEL_REQUESTS="false")
    assert ran.returncode == 1
    assert ran.stdout == ""  # raised (ModelRequestsDisabled) before the run: no result
    assert "Model requests are off" in ran.stderr
    assert "DATAMACHINE_ALLOW_MODEL_REQUESTS" in ran.stderr
    assert "settings set" not in ran.stderr


def test_the_docs_ship_with_the_package(db: Path) -> None:
    # A pip user had no clone and no URL: messages named docs/providers.md, a path they lacked.
    listed = _cli(db, "docs")
    assert listed.returncode == 0
    pages = {line.split()[0] for line in listed.stdout.splitlines()}
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert pages == {page.stem for page in docs.glob("*.md")}
    page = _cli(db, "docs", "sett")
    assert page.stdout == (docs / "settings.md").read_text(encoding="utf-8")
    missing = _cli(db, "docs", "zz")
    assert missing.returncode == 2
    assert "no page named 'zz'" in missing.stderr


def test_a_terminal_table_shows_markup_as_text(db: Path) -> None:
    # `settings list` on a terminal died with rich's MarkupError on a value "[/x]", and
    # "[red]..." came out red: values are text, whoever wrote them (MCP tool descriptions too).
    import pexpect

    assert _cli(db, "settings", "set", "x_closing", "[/x]").returncode == 0
    assert _cli(db, "settings", "set", "x_styled", "[red]alarm[/red]").returncode == 0
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("DATAMACHINE_")}
    env.update({"DATAMACHINE_DB": str(db), "DATAMACHINE_LOAD_PLUGINS": "", "TERM": "xterm",
                "COLUMNS": "160"})
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "settings", "list"],
                          encoding="utf-8", timeout=30, dimensions=(60, 160), env=env)
    child.expect(pexpect.EOF)
    child.close()
    out = child.before or ""
    assert child.exitstatus == 0, out
    assert "[/x]" in out
    assert "[red]alarm[/red]" in out


def test_settings_list_names_a_misspelt_environment_variable(db: Path) -> None:
    # DATAMACHINE_MAX_TRUNS=5 was read by nobody and said nothing.
    listed = _cli(db, "settings", "list", DATAMACHINE_MAX_TRUNS="5", DATAMACHINE_X_MINE="1")
    assert listed.returncode == 0
    assert "DATAMACHINE_MAX_TRUNS is set, but no setting 'max_truns'" in listed.stderr
    assert "did you mean DATAMACHINE_MAX_TURNS?" in listed.stderr
    assert "DATAMACHINE_X_MINE" not in listed.stderr  # x_ keys are the application's own


def test_a_password_in_a_base_url_is_never_listed(db: Path) -> None:
    url = "http://admin:hunter2-secret@127.0.0.1:9/v1"
    stored = _cli(db, "settings", "set", "openai_base_url", url)
    assert stored.returncode == 0
    assert "hunter2" not in stored.stdout
    for args in (("settings", "list"), ("settings", "list", "--json"),
                 ("settings", "get", "openai_base_url"), ("settings", "show", "openai_base_url"),
                 ("models",), ("models", "--json")):
        shown = _cli(db, *args)
        assert shown.returncode == 0, (args, shown.stderr)
        assert "hunter2" not in shown.stdout + shown.stderr, args
        assert "admin:****@127.0.0.1:9" in shown.stdout, args
    revealed = _cli(db, "settings", "get", "openai_base_url", "--reveal")
    assert "hunter2-secret" in revealed.stdout
