"""``datamachine run`` piped, as ``llm`` is used in scripts (DESIGN.md 25): stdout gets only the
answer, ``-v`` puts the report on stderr, and a terminal still gets the whole report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
from click.testing import CliRunner

from datamachine.cli import cli

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "DATAMACHINE_LOAD_PLUGINS": "",
            **extra}


def dm(db: Path, *args: str, input: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """``datamachine --db DB ARGS`` through real pipes (stdin, stdout and stderr)."""
    return subprocess.run([sys.executable, "-m", "datamachine", "--db", str(db), *args],
                          input=input, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=_env(db.parent, **env))


def invoke(db: Path, *args: str) -> tuple[int, str, str]:
    """In-process, stdout and stderr apart (neither is a terminal)."""
    done = CliRunner().invoke(cli, ["--db", str(db), *args])
    return done.exit_code, done.stdout, done.stderr


def test_piped_run_prints_only_the_answer_as_llm_does(tmp_path: Path) -> None:
    # `git diff | datamachine run "review" > out.md` saved the whole report, not the review.
    done = dm(tmp_path / "p.db", "run", "review this", input="diff --git a/x b/x\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "echo: diff --git a/x b/x\n review this\n"
    assert done.stderr == ""


def test_verbose_writes_the_report_to_stderr_and_keeps_stdout_the_answer(tmp_path: Path) -> None:
    code, out, err = invoke(tmp_path / "p.db", "run", "hi", "-v")
    assert code == 0
    assert out == "echo: hi\n"
    assert "status:      completed" in err
    assert "stopped:     the model gave its final answer." in err
    assert "budgets:     conversation_turns 1/25" in err
    session = re.search(r"transcript:  (\w{32})", err)
    assert session is not None
    long_code, long_out, long_err = invoke(tmp_path / "p.db", "run", "hi", "--verbose")
    assert (long_code, long_out) == (0, "echo: hi\n")
    assert "transcript:  " in long_err


def test_a_piped_run_that_stops_early_says_why_on_stderr_only(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    calls = [{"tool_calls": [{"id": f"c{i}", "name": "nope", "parameters": {"i": i}}]}
             for i in range(2)]
    script.write_text(json.dumps([*calls, {"content": "Summary: nothing was found."}]))
    code, out, err = invoke(tmp_path / "p.db", "run", "go", "--script", str(script),
                            "--max-turns", "2")
    assert code == 3
    assert out == "Summary: nothing was found.\n"  # the final summary is the answer
    [line] = err.splitlines()
    assert line.startswith("Stopped (budget_exceeded): budget 'conversation_turns' ran out "
                           "(2/2).")
    assert re.search(r"\(transcript \w{32}\)$", line)


def test_json_is_unchanged_when_piped(tmp_path: Path) -> None:
    code, out, err = invoke(tmp_path / "p.db", "run", "hi", "--json", "-v")
    assert code == 0
    assert json.loads(out)["final_content"] == "echo: hi"
    assert err == ""


def test_on_a_terminal_the_report_stays_on_stdout(tmp_path: Path) -> None:
    child = pexpect.spawn(sys.executable, ["-m", "datamachine", "--db", str(tmp_path / "t.db"),
                                           "run", "hi", "--no-stream"],
                          cwd=str(ROOT), encoding="utf-8", timeout=30,
                          env=_env(tmp_path, TERM="xterm", COLUMNS="120"))
    child.expect(pexpect.EOF)
    child.close()
    out = ANSI.sub("", child.before or "")
    assert child.exitstatus == 0, out
    assert "status:      completed" in out
    assert "final:       echo: hi" in out
    assert os.path.exists(tmp_path / "t.db")
