"""The pytest plugin as a new user meets it: a project of their own with nothing but a test
file, run by pytest in a subprocess (the plugin comes from the installed distribution)."""

from __future__ import annotations

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
    result = host.run_conversation([{"role": "user", "content": "hello"}],
                                   provider="openai", model="gpt-4o-mini")
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
    refused.stdout.fnmatch_lines(["*ERROR_CODE model_requests_disabled*"])


def test_without_the_switch_the_default_host_does_send_requests(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = _run(pytester, monkeypatch, "[pytest]\n")
    allowed.assert_outcomes(passed=2)
    # The request went out (and found nothing listening): not refused.
    assert "ERROR_CODE model_requests_disabled" not in allowed.stdout.str()
    allowed.stdout.fnmatch_lines(["*ERROR_CODE *"])
