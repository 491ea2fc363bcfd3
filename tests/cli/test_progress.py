"""A long run shows progress on stderr on a terminal: turn i of N, the tool running, budgets
near their ceiling (DESIGN.md 25); never in piped output. It is fed by the public event sink."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from datamachine.cli.progress import Progress, near_ceiling

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "160",
       "DATAMACHINE_LOAD_PLUGINS": ""}


@pytest.fixture
def slow_script(tmp_path: Path) -> Path:
    """Three slow turns: two tool calls, then the answer (the provider waits 0.5 s each)."""
    script = tmp_path / "slow.json"
    script.write_text(json.dumps([
        {"tool_calls": [{"id": "a", "name": "lookup", "parameters": {"q": 1}}],
         "delay_seconds": 0.5},
        {"tool_calls": [{"id": "b", "name": "lookup", "parameters": {"q": 2}}],
         "delay_seconds": 0.5},
        {"content": "Done at last.", "delay_seconds": 0.5}]))
    return script


def test_the_line_says_the_turn_the_tool_and_the_budgets_near_their_ceiling() -> None:
    progress = Progress(enabled=False, ceilings={"tool_calls": 4})
    progress("turn_started", {"turn": 1, "max_turns": 10})
    assert progress.text == "turn 1/10 · waiting for the model"
    for _ in range(3):
        progress("tool_call", {"tool_name": "search"})
    assert progress.text == "turn 1/10 · running tool search · near ceiling: tool_calls 3/4"
    progress("tool_result", {"tool_name": "search", "success": False})
    progress("turn_started", {"turn": 9, "max_turns": 10})
    assert progress.text == ("turn 9/10 · waiting for the model · near ceiling: "
                             "conversation_turns 9/10, tool_calls 3/4")
    progress("budget_pressure", {"budget": "total_tokens", "tier": "warning",
                                 "current": 950, "ceiling": 1000})
    assert progress.text.endswith("total_tokens 950/1000 · budget total_tokens warning "
                                  "(950/1000)")


@pytest.mark.parametrize(("current", "ceiling", "near"), [
    (19, 25, False), (20, 25, True), (1, 3, False), (2, 3, True), (79, 100, False),
    (80, 100, True), (1, 1, True)])
def test_near_means_at_most_a_fifth_left(current: int, ceiling: int, near: bool) -> None:
    assert near_ceiling(current, ceiling) is near


def _on_terminal(tmp_path: Path, command: str) -> tuple[int, str]:
    seen = io.StringIO()
    child = pexpect.spawn("/bin/sh", ["-c", command], cwd=str(ROOT), encoding="utf-8",
                          timeout=60, env={**ENV, "HOME": str(tmp_path)},
                          dimensions=(40, 160))
    child.logfile_read = seen
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None
    return child.exitstatus, seen.getvalue()


def test_a_slow_run_piped_to_a_file_shows_progress_on_the_terminal_only(
        tmp_path: Path, slow_script: Path) -> None:
    out = tmp_path / "out.md"
    command = (f"{shlex.quote(sys.executable)} -m datamachine --db {tmp_path / 'p.db'} run go "
               f"--script {slow_script} --max-turns 3 > {out}")
    code, terminal = _on_terminal(tmp_path, command)
    assert code == 0, terminal
    assert "turn 1/3 · waiting for the model" in terminal
    assert "near ceiling: conversation_turns 3/3" in terminal
    assert out.read_text() == "Done at last.\n"  # the answer, and nothing of the line


def test_a_streamed_run_on_a_terminal_shows_progress_between_its_texts(
        tmp_path: Path, slow_script: Path) -> None:
    # A run that streams showed nothing at all while the model (or a tool) was slow.
    command = (f"{shlex.quote(sys.executable)} -m datamachine --db {tmp_path / 'p.db'} run go "
               f"--script {slow_script} --max-turns 3")
    code, terminal = _on_terminal(tmp_path, command)
    assert code == 0, terminal
    assert "turn 1/3 · waiting for the model" in terminal
    assert "turn 2/3 · waiting for the model · near ceiling" in terminal
    assert terminal.index("turn 1/3") < terminal.index("Done at last.")


def test_piped_stderr_never_holds_the_line(tmp_path: Path, slow_script: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "datamachine", "--db", str(tmp_path / "p.db"),
                           "run", "go", "--script", str(slow_script), "--max-turns", "3", "-v"],
                          input="", capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**ENV, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Done at last.\n"
    assert "waiting for the model" not in done.stderr
    assert "\x1b[" not in done.stderr
    assert "status:      completed" in done.stderr
