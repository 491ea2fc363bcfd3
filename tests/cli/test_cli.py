"""The command line through click's runner, and the main job through a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from datamachine.cli import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, db: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(cli, ["--db", str(db), *args])
    return result.exit_code, result.output


def test_demo_runs_both_conversations_and_explains_how_they_stopped(
    runner: CliRunner, tmp_path: Path
) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "demo")
    assert code == 0, out
    assert "status:      completed" in out
    assert "REJECTED: DUPLICATE REJECTED" in out
    assert "status:      budget_exceeded" in out
    assert "Maximum conversation turns (4) reached" in out
    assert str(tmp_path / "d.db") in out


def test_demo_json_is_two_results(runner: CliRunner, tmp_path: Path) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "demo", "--json")
    assert code == 0
    first, second = json.loads(out)
    assert (first["status"], second["status"]) == ("completed", "budget_exceeded")


def test_run_echoes_with_the_default_scripted_provider(runner: CliRunner, tmp_path: Path) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "run", "hello there", "--json")
    assert code == 0
    assert json.loads(out)["final_content"] == "echo: hello there"


@pytest.mark.parametrize("bad", ["0", "-1", "ten", "10001"])
def test_run_refuses_bad_max_turns_with_exit_2(runner: CliRunner, tmp_path: Path, bad: str) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "run", "hi", "--max-turns", bad)
    assert code == 2
    assert "--max-turns" in out


def test_run_with_script_file_and_budget_exit_code_3(runner: CliRunner, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "", "tool_calls": [
        {"id": f"x{i}", "name": "nonexistent", "parameters": {"i": i}}]} for i in range(5)]))
    code, out = invoke(runner, tmp_path / "d.db", "run", "go", "--script", str(script),
                       "--max-turns", "2")
    assert code == 3, out
    assert "budget_exceeded" in out


def test_run_with_unknown_tool_name_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "run", "go", "--tools", "nope")
    assert code == 2
    assert "no registered tool named 'nope'" in out


def test_budgets_list_shows_resolution_and_owner(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    assert invoke(runner, db, "settings", "set", "max_turns", "500")[0] == 0
    code, out = invoke(runner, db, "budgets", "list", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["conversation_turns"]["ceiling"] == 200
    assert rows["conversation_turns"]["source"] == "setting (clamped)"
    assert rows["http_fetches"]["owner"] == "fetch"


def test_budgets_list_shows_unit_scope_unset_and_unlimited(runner: CliRunner,
                                                           tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    assert invoke(runner, db, "settings", "set", "chat_max_turns", '"unlimited"')[0] == 0
    code, out = invoke(runner, db, "budgets", "list", "--json")
    assert code == 0
    rows = {row["name"]: row for row in json.loads(out)}
    assert set(rows["provider_retries"]) == {"name", "unit", "scope", "default", "min", "max",
                                             "setting", "ceiling", "source", "owner"}
    assert (rows["provider_retries"]["scope"], rows["provider_retries"]["min"]) == ("request", 0)
    assert (rows["wall_clock_seconds"]["unit"], rows["wall_clock_seconds"]["default"],
            rows["wall_clock_seconds"]["ceiling"]) == ("seconds", None, None)
    assert (rows["cost"]["default"], rows["cost"]["ceiling"]) == (None, None)
    assert (rows["chat_turns"]["ceiling"], rows["chat_turns"]["source"]) == (None, "setting")
    code, text = invoke(runner, db, "budgets", "list")
    assert code == 0
    assert "1000000000000" not in text  # an unset ceiling says so, never 10^12
    lines = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    # name, unit, scope, default, clamp (two words), setting, ceiling, from, owner
    assert lines["total_tokens"][1:4] == ["tokens", "run", "unset"]
    assert lines["total_tokens"][7] == "unset"
    assert lines["chat_turns"][1:3] == ["count", "session"]
    assert "unlimited" in lines["chat_turns"]
    assert lines["wall_clock_seconds"][1] == "seconds"


def test_settings_roundtrip_and_validation(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    assert invoke(runner, db, "settings", "set", "default_model", "small")[0] == 0
    assert invoke(runner, db, "settings", "get", "default_model")[1].strip() == '"small"'
    code, out = invoke(runner, db, "settings", "set", "max_turns", "0")
    assert code == 2
    assert "max_turns" in out
    code, out = invoke(runner, db, "settings", "list", "--json")
    listed = {row["key"]: row for row in json.loads(out)}
    assert (listed["default_model"]["value"], listed["default_model"]["source"]) == ("small",
                                                                                   "db")
    # every host gets a site id at boot; the rest are declared defaults
    assert {k for k, row in listed.items() if row["source"] == "db"} == {"default_model",
                                                                         "site_id"}
    assert "removed" in invoke(runner, db, "settings", "unset", "default_model")[1]


def test_transcripts_list_and_show(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    code, out = invoke(runner, db, "run", "remember me", "--json")
    session = json.loads(out)["transcript_session_id"]
    code, out = invoke(runner, db, "transcripts", "list")
    assert code == 0
    assert session in out
    code, out = invoke(runner, db, "transcripts", "show", session)
    assert code == 0
    assert "[user/text] remember me" in out
    code, out = invoke(runner, db, "transcripts", "show", "missing-id")
    assert code == 1
    assert out.startswith("Error:")


def test_plugins_lists_default_and_installed_plugins(runner: CliRunner, tmp_path: Path) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "plugins", "--json")
    assert code == 0
    names = {row["name"]: row for row in json.loads(out)}
    assert names["fetch"]["distribution"] == "datamachine-fetch"
    assert "register_budgets" in names["fetch"]["hooks"]
    assert "register_providers" in names["datamachine.default_plugins.providers"]["hooks"]


def test_demo_through_a_real_subprocess(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "s.db"),
                           "demo"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "A runaway agent, stopped by its turn budget" in done.stdout
    assert (tmp_path / "s.db").exists()


def test_chat_through_the_runner_is_headless_and_aborts_at_the_limit(
    runner: CliRunner, tmp_path: Path
) -> None:
    result = runner.invoke(cli, ["--db", str(tmp_path / "d.db"), "chat", "--max-turns", "2"],
                           input="hello\nagain\nmore\n")
    assert result.exit_code == 3
    assert "assistant> echo: hello" in result.output
    assert "turns used: 1/2" in result.output
    # The stop names its budget and flag, as every budget stop does.
    assert ("The session reached its turn limit (budget chat_turns: max_chat_turns_reached) "
            "and was not continued; it is now closed.") in result.stdout


def test_chat_max_turns_above_the_registered_clamp_is_clamped_with_a_warning(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datamachine.booting
    from tests.plugins import chat_turns_50

    booted = datamachine.booting.boot

    def boot_with_the_plugin(**kwargs: Any) -> Any:
        return booted(**kwargs, plugins=[chat_turns_50])

    monkeypatch.setattr(datamachine.booting, "boot", boot_with_the_plugin)
    result = runner.invoke(cli, ["--db", str(tmp_path / "d.db"), "chat", "--max-turns", "60"],
                           input="")
    assert result.exit_code == 0, result.output
    assert "(limit: 50 turns)" in result.stdout
    assert result.stderr == ("Warning: Budget 'chat_turns': requested ceiling 60 (from "
                             "override) is outside its range [1, 50]; using 50.\n")
    kept = runner.invoke(cli, ["--db", str(tmp_path / "d.db"), "chat", "--max-turns", "40"],
                         input="")
    assert "(limit: 40 turns)" in kept.stdout
    assert kept.stderr == ""


def test_chat_max_turns_takes_unlimited_and_refuses_what_no_budget_takes(
    runner: CliRunner, tmp_path: Path
) -> None:
    db = str(tmp_path / "d.db")
    open_ended = runner.invoke(cli, ["--db", db, "chat", "--max-turns", "unlimited"], input="")
    assert open_ended.exit_code == 0
    assert "(limit: unlimited turns)" in open_ended.stdout
    for bad in ("0", "10001", "ten", "2.5"):
        refused = runner.invoke(cli, ["--db", db, "chat", "--max-turns", bad], input="")
        assert refused.exit_code == 2, bad
        assert refused.stderr.startswith("Error: --max-turns must be a positive integer"), bad


def test_chat_max_turns_with_an_existing_session_says_it_keeps_its_limit(
    runner: CliRunner, tmp_path: Path
) -> None:
    db = str(tmp_path / "d.db")
    first = runner.invoke(cli, ["--db", db, "chat", "--max-turns", "5"], input="")
    session_id = first.stdout.split()[2]
    again = runner.invoke(cli, ["--db", db, "chat", "--session", session_id, "--max-turns",
                                "9"], input="")
    assert again.exit_code == 0
    assert "(limit: 5 turns)" in again.stdout
    assert "keeps its limit (5)" in again.stderr


def test_chat_ctrl_d_through_the_runner(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli, ["--db", str(tmp_path / "d.db"), "chat"], input="")
    assert result.exit_code == 0
    assert "Bye." in result.output


def test_errors_are_one_line_and_debug_shows_the_traceback(
    runner: CliRunner, tmp_path: Path
) -> None:
    db = tmp_path / "d.db"
    plain = runner.invoke(cli, ["--db", str(db), "transcripts", "show", "nope"])
    assert plain.exit_code == 1
    assert plain.output.count("\n") == 1
    debug = runner.invoke(cli, ["--db", str(db), "--debug", "transcripts", "show", "nope"])
    assert debug.exception is not None
    assert type(debug.exception).__name__ == "TranscriptNotFound"


@pytest.mark.parametrize("args", [
    ["run", "hi", "--json"],
    ["budgets", "list", "--json"],
    ["settings", "list", "--json"],
    ["transcripts", "list", "--json"],
    ["plugins", "--json"],
    ["jobs", "list", "--json"],
    ["sessions", "list", "--json"],
    ["tokens", "list", "--json"],
    ["demo", "--json"],
])
def test_commands_through_a_real_subprocess(tmp_path: Path, args: list[str]) -> None:
    # stdin closed: `run` joins piped stdin to its PROMPT, and an inherited open pipe would wait.
    done = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "s.db"),
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)


def test_tokens_create_and_revoke_through_a_real_subprocess(tmp_path: Path) -> None:
    def cli_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "datamachine", "--db",
                               str(tmp_path / "s.db"), *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)

    created = cli_run("tokens", "create", "partner")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip().splitlines()[-1]
    assert token.startswith("dm_")
    assert cli_run("tokens", "revoke", "partner").returncode == 0
    listed = json.loads(cli_run("tokens", "list", "--json").stdout)
    assert [t["name"] for t in listed] == ["partner"]


def test_jobs_and_sessions_can_be_browsed(runner: CliRunner, tmp_path: Path) -> None:
    import bootstrap

    db = tmp_path / "d.db"
    with bootstrap.boot(db, load_entrypoints=False) as host:
        job = host.jobs.create(flow_step_id="step-1", engine_data={"k": "v"})
        session = host.chat_sessions.create(max_turns=4)
    code, out = invoke(runner, db, "jobs", "list", "--json")
    assert code == 0
    assert json.loads(out)[0]["flow_step_id"] == "step-1"
    code, out = invoke(runner, db, "jobs", "show", str(job.id), "--json")
    assert json.loads(out)["engine_data"] == {"k": "v"}
    code, out = invoke(runner, db, "jobs", "show", str(job.id))
    assert code == 0
    assert out.splitlines()[:4] == [f"job {job.id}: pending", "flow step: step-1", "flags: -",
                                    "budget: -"]
    code, out = invoke(runner, db, "sessions", "list")
    assert session.id in out
    assert "0/4" in out
    code, out = invoke(runner, db, "sessions", "show", session.id)
    assert json.loads(out)["max_turns"] == 4
    code, out = invoke(runner, db, "jobs", "show", "999")
    assert code == 1


@pytest.mark.parametrize("job_id", ["99999999999999999999999", "0"])
def test_jobs_show_of_an_id_no_job_can_have_is_one_line_and_exit_2(
        runner: CliRunner, tmp_path: Path, job_id: str) -> None:
    result = runner.invoke(cli, ["--db", str(tmp_path / "d.db"), "jobs", "show", job_id])
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"Error: A job id is an integer from 1 to 9223372036854775807 (as returned by "
        f"jobs.create), got {job_id}."]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_run_sends_dash_o_model_options_to_the_provider(
    runner: CliRunner, tmp_path: Path
) -> None:
    from tests.providers.fake_openai import FakeOpenAIServer, Reply, completion

    with FakeOpenAIServer() as server:
        server.enqueue(Reply(body=completion("configured")))
        invoke(runner, tmp_path / "d.db", "settings", "set", "openai_base_url",
               json.dumps(server.url + "/v1"))
        code, out = invoke(runner, tmp_path / "d.db", "run", "hi", "--provider", "openai",
                           "--model", "m", "-o", "temperature", "0.2", "-o", "stop", '["###"]',
                           "--option", "tool_choice", "none", "--json")
        assert code == 0, out
        body = server.requests[0].json
    assert (body["temperature"], body["stop"]) == (0.2, ["###"])
    assert "tool_choice" not in body  # no tools offered: tool options stay home


@pytest.mark.parametrize(("args", "message"), [
    (["-o", "temperature", "hot"], "-o['temperature']"),
    (["-o", "model", "x"], "the run decides the request's model"),
])
def test_run_refuses_bad_dash_o_with_exit_2(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "run", "hi", *args)
    assert code == 2
    assert message in out


def test_continue_resumes_a_stopped_run_by_an_id_prefix(runner: CliRunner, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "", "tool_calls": [
        {"id": f"x{i}", "name": "nonexistent", "parameters": {"i": i}}]} for i in range(3)]))
    db = tmp_path / "d.db"
    code, out = invoke(runner, db, "run", "go", "--script", str(script), "--max-turns", "1",
                       "--json")
    assert code == 3, out
    session = json.loads(out)["transcript_session_id"]

    code, out = invoke(runner, db, "continue", session[:6], "--extend-by", "2", "--json")

    assert code == 0, out
    resumed = json.loads(out)
    assert resumed["transcript_session_id"] == session
    assert resumed["cumulative_turn_count"] == 1 + resumed["turn_count"]
    assert resumed["status"] == "completed"


@pytest.mark.parametrize(("session", "message"), [
    ("nosuch", "No transcript id starts with 'nosuch'"), ("x" * 201, "A session id must be"),
])
def test_continue_names_what_is_wrong_with_the_session(
    runner: CliRunner, tmp_path: Path, session: str, message: str,
) -> None:
    code, out = invoke(runner, tmp_path / "d.db", "continue", session)
    assert code in (1, 2)
    assert message in out


def test_a_prefix_that_starts_several_sessions_lists_them() -> None:
    import bootstrap
    from datamachine.errors import UsageError

    with bootstrap.boot(":memory:", load_entrypoints=False) as host:
        for session in ("abc1", "abc2", "xyz"):
            host.run_conversation([{"role": "user", "content": "hi"}], None, "scripted", "m",
                                  payload={"transcript_session_id": session})
        assert host.transcripts.resolve("xy") == "xyz"
        assert host.transcripts.resolve("abc1") == "abc1"
        with pytest.raises(UsageError, match="Ambiguous transcript id prefix 'abc'"):
            host.transcripts.resolve("abc")


def _paused_run(runner: CliRunner, db: Path, tmp_path: Path) -> str:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "", "tool_calls": [
        {"id": "x1", "name": "nonexistent", "parameters": {}}]}]))
    code, out = invoke(runner, db, "run", "go", "--script", str(script), "--max-turns", "1",
                       "--confirmation", "pause", "--json")
    assert code == 4, out
    result = json.loads(out)
    assert result["status"] == "awaiting_confirmation"
    assert result["pending"]["kind"] == "budget"
    return str(result["transcript_session_id"])


def test_a_paused_run_exits_4_and_resume_answers_it(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    session = _paused_run(runner, db, tmp_path)
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps([{"content": "all done"}]))
    code, out = invoke(runner, db, "resume", session[:8], "--approve", "--extend-by", "2",
                       "--script", str(answer))
    assert code == 0, out
    assert "final:       all done" in out
    code, out = invoke(runner, db, "resume", session[:8], "--approve")
    assert code == 1
    assert "not waiting for an answer" in out


def test_resume_needs_an_answer_and_decline_stops_the_run(runner: CliRunner,
                                                         tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    session = _paused_run(runner, db, tmp_path)
    code, out = invoke(runner, db, "resume", session)
    assert code == 2
    assert "--approve" in out
    code, out = invoke(runner, db, "resume", session, "--decline")
    assert code == 3, out
    assert "budget_exceeded" in out


def test_continue_on_a_paused_run_approves_it(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    session = _paused_run(runner, db, tmp_path)
    code, out = invoke(runner, db, "continue", session, "--extend-by", "3")
    assert code == 0, out
    assert "status:      completed" in out
    assert "echo: go" in out


def test_spend_shows_each_window_as_a_table_and_as_json(runner: CliRunner,
                                                        tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    code, out = invoke(runner, db, "spend")
    assert code == 0
    assert "No spend limits are set" in out
    limits = [{"name": "daily_tokens", "budget": "total_tokens", "window": "day", "limit": 5000},
              {"name": "per_agent", "budget": "total_tokens", "window": "month",
               "limit": 900, "scope": "agent"},
              {"name": "hourly_spend", "budget": "cost", "window": "hour", "limit_usd": 0.5}]
    assert invoke(runner, db, "settings", "set", "spend_limits", json.dumps(limits))[0] == 0
    assert invoke(runner, db, "settings", "set", "prices",
                  json.dumps({"tiny": {"input": 1, "output": 2}}))[0] == 0
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"content": "hi", "usage": {
        "prompt_tokens": 600, "completion_tokens": 300, "total_tokens": 900}}]))
    code, out = invoke(runner, db, "run", "hello", "--script", str(script), "--model", "tiny",
                       "--json")
    assert code == 0, out
    assert json.loads(out)["usage"]["cost_usd"] == pytest.approx(0.0012)
    code, out = invoke(runner, db, "spend", "--json")
    assert code == 0, out
    rows = {row["limit"]: row for row in json.loads(out)}
    assert set(rows) == {"daily_tokens", "hourly_spend"}  # no agent used per_agent yet
    assert (rows["daily_tokens"]["used"], rows["daily_tokens"]["left"]) == (900, 4100)
    assert rows["hourly_spend"]["used"] == 1200  # 600 x $1 + 300 x $2 per million
    assert 0 < rows["hourly_spend"]["resets_in_seconds"] <= 3600
    code, out = invoke(runner, db, "spend")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["limit", "window", "scope", "used", "of", "left", "reserved",
                              "resets", "in"]
    assert any(line.startswith("daily_tokens") and "900 tokens" in line for line in lines)
    assert any(line.startswith("hourly_spend") and "$0.0012" in line for line in lines)


def test_a_paused_runs_hint_names_the_whole_session_id(runner: CliRunner, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"content": "", "tool_calls": [
        {"id": "x1", "name": "nonexistent", "parameters": {}}]}]))
    code, out = invoke(runner, tmp_path / "d.db", "run", "go", "--script", str(script),
                       "--max-turns", "1", "--confirmation", "pause", "--verbose")
    assert code == 4, out
    session = out.split("transcript:  ")[1].split()[0]
    assert len(session) == 32
    assert f"`datamachine resume {session} --approve`" in out
