"""The benchmark scripts still run (tiny T, one run each); nothing here is timed or compared.

The peers are never installed or imported here: they live only in ``bench/.venv``, which
``bench/run.py`` makes when the benchmark itself runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench import dm_loop, run
from bench.concurrency import measure_concurrency
from bench.scenario import answer_text, measure, measure_interleaved


def test_floor_and_datamachine_runs_reach_the_scripted_answer(tmp_path: Path) -> None:
    memory = dm_loop.make_host()
    stored = dm_loop.make_host(tmp_path / "bench.db")
    try:
        assert dm_loop.floor(2) == answer_text(2)
        in_memory: Any = dm_loop.memory_runner(memory)(2)
        all_on: Any = dm_loop.all_on_runner(stored)(2)
        timed: Any = dm_loop.all_on_runner(stored, wall_clock=True)(2)
        persisted: Any = dm_loop.persisted_runner(stored)(2)
        for result in (in_memory, all_on, timed, persisted):
            assert result.turn_count == 3
        assert len(stored.transcripts.get(all_on.transcript_session_id)) == 6
    finally:
        memory.close()
        stored.close()


def test_measure_helpers_report_one_figure_per_runner() -> None:
    single = measure(dm_loop.floor, 2, runs=1, warmup=0)
    assert single.runs == 1
    assert single.low <= single.median <= single.high
    both = measure_interleaved({"a": dm_loop.floor, "b": dm_loop.floor}, 2, runs=1, warmup=0)
    assert set(both) == {"a", "b"}


def test_concurrent_async_conversations_complete() -> None:
    figures = measure_concurrency(3, 2, batches=1)
    assert figures.conversations == 3
    assert figures.peak_mib > 0


def test_run_script_prints_every_table_without_the_peers() -> None:
    text = run.main(["--quick", "--no-peers", "--no-boot"])
    assert "| floor: bare Python loop |" in text
    assert f"| {run.BASE_ROW} |" in text
    assert f"| {run.SQLITE_ROW} |" in text
    assert "## Concurrency" in text
    assert "## Profile" in text
    assert not any(name in sys.modules for name in ("pydantic_ai", "agents", "langgraph"))


def test_persistence_script_runs_through_a_writer() -> None:
    from bench import persistence

    overall, first, last = persistence.one_run(3)
    assert min(overall, first, last) > 0


def test_http_bench_floor_and_datamachine_reach_the_answer_over_loopback() -> None:
    import asyncio

    from bench import http_bench

    server, base_url = http_bench.start_server()
    loop = asyncio.new_event_loop()
    try:
        floor = http_bench.floor_runner(base_url)
        datamachine_run = http_bench.datamachine_runner(base_url)
        assert loop.run_until_complete(floor(2)) == answer_text(2)
        result: Any = loop.run_until_complete(datamachine_run(2))
        assert result.turn_count == 3
    finally:
        loop.close()
        server.kill()
        server.wait(timeout=10)


def test_time_to_first_delta_bench_reads_both_streams() -> None:
    from bench import ttfd

    figures = ttfd.measure(runs=2, rounds=1)
    assert len(figures) == 2
    assert all(median > 0 for median, _, _ in figures.values())


def test_context_cost_measures_each_strategy_on_a_small_history() -> None:
    from bench.context_cost import measure

    found = measure(turns=12, result_bytes=500, repeat=1)
    assert set(found) == {"clear_tool_results", "summarize", "drop_oldest",
                          "(projecting the whole history)"}
    assert all(ms > 0 for ms in found.values())


def test_compare_runs_a_window_the_runs_never_fill() -> None:
    from bench.compare import _datamachine_runner

    run = _datamachine_runner(context=True)
    result: Any = run(3)
    assert result.budgets["context_tokens"]["ceiling"] == 10**8
    assert result.compactions == 0


def test_guard_cost_times_the_guard_on_and_off(monkeypatch: Any) -> None:
    import os

    from bench import guard_cost

    monkeypatch.delenv(guard_cost.SETTING, raising=False)
    figures = guard_cost.run_costs(rounds=1)
    assert set(figures) == {"turn_on_us", "turn_off_us", "guard_per_turn_us",
                            "guard_set_up_us"}
    assert figures["turn_on_us"] > 0
    assert figures["turn_off_us"] > 0
    assert guard_cost.SETTING not in os.environ  # the setting is put back as it was
    assert guard_cost.guard_alone(number=1000) > 0
