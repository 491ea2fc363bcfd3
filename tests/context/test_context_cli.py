"""The context window on the command line (DESIGN.md 21): ``transcripts show`` marks each
compaction where it happened, and ``datamachine models`` shows each endpoint's window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import bootstrap
import datamachine
from datamachine.cli import cli


@datamachine.tool
def read_page(n: int) -> str:
    """Read page ``n`` of the report."""
    return f"page {n}: " + "lorem ipsum " * 150


def test_transcripts_show_marks_each_compaction(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_page", "parameters": {"n": n}}]} for n in range(1, 9)]
    script.append({"content": "I read 8 pages."})
    with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
        host.settings.set("context_windows", {"small": 2048})
        result = host.run_conversation([{"role": "user", "content": "Read the report."}],
                                       [read_page], "scripted", "small",
                                       payload={"script": script,
                                                "transcript_session_id": "compacted"})
    assert result.compactions > 0
    runner = CliRunner()
    shown = runner.invoke(cli, ["--db", str(db), "transcripts", "show", "compacted"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("-- context compacted")]
    assert len(marks) == result.compactions
    assert "(clear_tool_results) before turn" in lines[marks[0]]
    assert "message(s) removed or cleared --" in lines[marks[0]]
    assert lines[marks[0] - 1].startswith("[tool/tool_result] page ")  # after what it covered
    as_json = json.loads(runner.invoke(cli, ["--db", str(db), "transcripts", "show",
                                             "compacted", "--json"]).output)
    assert [c["seq"] for c in as_json["compactions"]] == list(range(1, len(marks) + 1))


def test_models_shows_each_endpoints_window(tmp_path: Path) -> None:
    from tests.context.windowed_server import WindowedModel

    server = WindowedModel(flavour="llama.cpp", window=4096).start()
    db = tmp_path / "m.db"
    try:
        with bootstrap.boot(db_path=db, load_entrypoints=False) as host:
            host.settings.set("providers", {
                "fixed": {"type": "openai", "base_url": server.base_url,
                          "context_window": 8192},
                "llama": {"type": "openai", "base_url": server.base_url,
                          "context_window": "auto"}})
            host.settings.set("context_windows", {"gpt-4o*": 128000})
        runner = CliRunner()
        listed = json.loads(runner.invoke(cli, ["--db", str(db), "models", "--json"]).output)
        windows = {row["name"]: row["context_window"] for row in listed["providers"]}
        assert windows["fixed"] == 8192
        assert windows["llama"] == "auto"
        assert windows["scripted"] is None
        assert listed["context_windows"] == {"gpt-4o*": 128000}
        assert server.gets == []  # nothing asked without --remote
        text = runner.invoke(cli, ["--db", str(db), "models", "--remote"]).output
        assert "4,096" in text
        assert "8,192" in text
        assert "context windows by model: gpt-4o*: 128,000" in text
        assert server.gets.count("/props") == 1  # and each endpoint's /v1/models
    finally:
        server.stop()
