"""The pytest plugin as a new user meets it: a project of their own with nothing but a test
file, run by pytest in a subprocess (the plugin comes from the installed distribution)."""

from __future__ import annotations

import os
import re

import pytest

APP_TEST = '''
import datamachine


def test_my_app(dm_host, scripted_model):
    scripted_model.enqueue({"content": "Hi from the script."})
    result = datamachine.run_conversation([{"role": "user", "content": "hello"}])
    assert result.final_content == "Hi from the script."
    assert scripted_model.requests[0].messages[-1]["content"] == "hello"


def test_default_host_outside_dm_host():
    host = datamachine.get_default_host()
    try:
        result = host.run_conversation([{"role": "user", "content": "hello"}],
                                       provider="openai", model="gpt-4o-mini")
    except datamachine.ModelRequestsDisabled as refused:
        print("REFUSED", refused.provider)
    else:
        print("ERROR_CODE", result.error_code)
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ini: str) -> pytest.RunResult:
    pytester.makeini(ini)
    pytester.makepyfile(test_app=APP_TEST)
    env = {"DATAMACHINE_DB": str(pytester.path / "default.db"), "DATAMACHINE_LOAD_PLUGINS": "",
           "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
           "DATAMACHINE_PROVIDER_MAX_RETRIES": "0"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")


def test_a_new_project_gets_the_fixtures_and_can_refuse_model_requests_suite_wide(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    refused = _run(pytester, monkeypatch, "[pytest]\ndatamachine_allow_model_requests = false\n")
    refused.assert_outcomes(passed=2)
    refused.stdout.fnmatch_lines(["*REFUSED openai*"])


def test_without_the_switch_the_default_host_does_send_requests(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = _run(pytester, monkeypatch, "[pytest]\n")
    allowed.assert_outcomes(passed=2)
    # The request went out (and found nothing listening): not refused.
    assert "REFUSED" not in allowed.stdout.str()
    allowed.stdout.fnmatch_lines(["*ERROR_CODE *"])


UNFIXTURED_TEST = '''
import os
import subprocess
import sys

import datamachine


def test_the_default_host_without_dm_host():
    result = datamachine.run_conversation([{"role": "user", "content": "hello"}])
    assert result.final_content == "echo: hello"
    print("DEFAULT_DB", datamachine.get_default_host().db_path)


def test_boot_without_a_db_path():
    with datamachine.boot(load_entrypoints=False) as host:
        assert host.run_conversation([{"role": "user", "content": "hi"}]).status == "completed"
        print("BOOT_DB", host.db_path)


def test_a_datamachine_subprocess():
    ran = subprocess.run([sys.executable, "-m", "datamachine", "run", "hi"], text=True,
                         capture_output=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    print("ENV_DB", os.environ["DATAMACHINE_DB"])
'''


def test_tests_without_dm_host_write_nothing_outside_the_session_temporary_directory(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # A test without dm_host wrote its run into ~/.local/share/datamachine/datamachine.db.
    home, tmp = pytester.path / "home", pytester.path / "tmp"
    home.mkdir()
    tmp.mkdir()
    monkeypatch.delenv("DATAMACHINE_DB", raising=False)
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "")
    for name, folder in {"HOME": home, "XDG_DATA_HOME": home / "data",
                         "XDG_CONFIG_HOME": home / "config", "XDG_CACHE_HOME": home / "cache",
                         "XDG_STATE_HOME": home / "state", "TMPDIR": tmp}.items():
        monkeypatch.setenv(name, str(folder))
    pytester.makepyfile(test_unfixtured=UNFIXTURED_TEST)
    ran = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider",
                                        f"--basetemp={pytester.path / 'basetemp'}")
    ran.assert_outcomes(passed=3)
    printed = dict(re.findall(r"(DEFAULT_DB|BOOT_DB|ENV_DB) (\S+)", ran.stdout.str()))
    assert set(printed) == {"DEFAULT_DB", "BOOT_DB", "ENV_DB"}
    for path in printed.values():
        assert path.startswith(str(tmp) + os.sep)  # the session's temporary database
    assert list(home.rglob("*")) == []  # nothing in the user's data, config or cache dirs
    assert list(tmp.iterdir()) == []  # and the temporary directory is gone again
