"""Run the whole benchmark and print the tables in Markdown: ``python3 bench/run.py``.

With the peers (the default), the script first makes its own environment, ``bench/.venv``
(``python -m venv``, then pip installs the pinned peers of ``bench/requirements.txt`` and this
project in editable mode; redone when those or ``pyproject.toml`` change), and re-runs itself there,
so every framework runs on the same interpreter in one process. ``--no-peers`` runs datamachine
and the floor only, on whatever interpreter runs the script.

    python3 bench/run.py                 # everything (about ten minutes on two cores)
    .venv/bin/python bench/run.py --no-peers      # datamachine, the floor, concurrency, boot
    .venv/bin/python bench/run.py --quick --no-peers --no-boot   # seconds; as the smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import hashlib
import io
import os
import platform
import pstats
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV = BENCH / ".venv"
REQUIREMENTS = BENCH / "requirements.txt"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# -- the benchmark environment ----------------------------------------------------------------
# The rows the targets apply to: every check on (budgets, an event sink, duplicate
# checks, a completion policy), without and with SQLite transcripts.
BASE_ROW = "datamachine, in memory, all checks on"
SQLITE_ROW = "datamachine, SQLite file, all checks on"


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def _in_bench_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def ensure_environment() -> None:
    """Create ``bench/.venv`` with the pinned peers and the project, unless it is up to date."""
    stamp = VENV / ".bench-requirements"
    # Redone when the pins or the project's own dependencies change.
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()
                            + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == wanted and _venv_python().exists():
        return
    print(f"setting up {VENV} (pinned peers from {REQUIREMENTS.name}) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(_venv_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS), "-e", str(ROOT)], check=True)
    stamp.write_text(wanted)


# -- the sections -------------------------------------------------------------------------------
def machine_section() -> list[str]:
    """The machine and interpreter the figures come from."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return [
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- cores (`nproc`): {os.cpu_count()}; CPU: {cpu}",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.system()} {platform.release()}",
        f"- load average at start: {', '.join(f'{x:.2f}' for x in load)} (the machine is shared)",
    ]


def _runs_for(turns: int, quick: bool) -> int:
    if quick:
        return 1
    return {10: 150, 50: 40, 200: 12}.get(turns, 10)


def per_turn_section(turn_counts: Sequence[int], quick: bool, peers: bool) -> list[str]:
    """µs per turn for every framework and T, measured interleaved in this process."""
    base = BASE_ROW
    from bench import dm_loop
    from bench.scenario import Figures, measure_interleaved

    directory = tempfile.TemporaryDirectory(prefix="dm-bench-")
    memory_host = dm_loop.make_host()
    file_host = dm_loop.make_host(Path(directory.name) / "bench.db")
    runners: dict[str, Callable[[int], object]] = {
        "floor: bare Python loop": dm_loop.floor,
        BASE_ROW: dm_loop.checked_runner(memory_host, persist=False),
        SQLITE_ROW: dm_loop.checked_runner(file_host, persist=True),
        "datamachine, in memory, defaults (no event sink, built-in policy)":
            dm_loop.memory_runner(memory_host),
        "datamachine, SQLite file, defaults": dm_loop.persisted_runner(file_host),
        "datamachine, all on + budget pressure (SQLite file)":
            dm_loop.all_on_runner(file_host),
        "datamachine, all on + wall-clock rail (`max_seconds`)":
            dm_loop.all_on_runner(file_host, wall_clock=True),
    }
    loop: asyncio.AbstractEventLoop | None = None
    if peers:
        from bench.peers import PEERS, sync_adapter

        loop = asyncio.new_event_loop()
        for name, make in PEERS.items():
            runners[name] = sync_adapter(loop, make())
    # Everything built so far (the frameworks themselves, their agents and hosts) is frozen out
    # of the garbage collector, so no framework pays to scan another's objects.
    gc.collect()
    gc.freeze()
    results: dict[int, dict[str, Figures]] = {}
    try:
        for turns in turn_counts:
            results[turns] = measure_interleaved(runners, turns, _runs_for(turns, quick),
                                                 warmup=0 if quick else 2,
                                                 rounds={10: 10, 50: 5}.get(turns, 3))
        # What every run pays once: set-up, the loop's start and end, the result.
        single = measure_interleaved({"memory": runners[base]}, 0, 1 if quick else 300,
                                     warmup=0 if quick else 5, rounds=3)["memory"]
    finally:
        gc.unfreeze()
        if loop is not None:
            loop.close()
        memory_host.close()
        file_host.close()
        directory.cleanup()

    header = "| µs per turn: median (min-max) | " + " | ".join(f"T = {t}" for t in turn_counts)
    lines = [header + " |", "|---|" + "---|" * len(turn_counts)]
    for name in runners:
        cells = []
        for turns in turn_counts:
            figures = results[turns][name]
            cell = figures.cell()
            if name not in (base, "floor: bare Python loop"):
                cell += f" **{figures.median / results[turns][base].median:.1f}x**"
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    runs = ", ".join(f"T = {t}: {_runs_for(t, quick)}" for t in turn_counts)
    lines.append("")
    lines.append(f"Runs per cell ({runs}), taking turns across frameworks in rounds; **Nx** = "
                 f"that row's median over *{base}* in the same run.")
    lines.append(f"A datamachine run whose model answers at once (T = 0, one request, no tool) "
                 f"costs {single.cell()} µs ({base}): the per-run part of every figure above.")
    flat = [results[t][base].median for t in turn_counts]
    if len(flat) > 1:
        lines.append(f"{base}, T = {turn_counts[-1]} over T = {turn_counts[0]}: "
                     f"{flat[-1] / flat[0]:.2f}x per turn.")
    return lines


def concurrency_section(levels: Sequence[int], turns: int, quick: bool) -> list[str]:
    """Concurrent async conversations: µs per turn and peak memory."""
    from bench.concurrency import measure_concurrency

    lines = [f"| concurrent conversations (T = {turns}, async provider) | µs per turn: median "
             "(min-max) | vs 1 | peak traced memory |", "|---|---|---|---|"]
    single: float | None = None
    for level in levels:
        batches = 1 if quick else (30 if level == 1 else 7 if level <= 100 else 3)
        figures = measure_concurrency(level, turns, batches)
        single = figures.median if single is None else single
        lines.append(f"| {level:,} | {figures.median:,.1f} ({figures.low:,.1f}-"
                     f"{figures.high:,.1f}) | {figures.median / single:.2f}x | "
                     f"{figures.peak_mib:,.1f} MiB |")
    return lines


def boot_section(quick: bool, peers: bool) -> list[str]:
    """Import and boot times in fresh processes."""
    from bench.boot import BOOT_STATEMENTS, PEER_IMPORTS, import_breakdown, measure_startup

    statements = dict(BOOT_STATEMENTS)
    if peers:
        statements.update(PEER_IMPORTS)
    runs = 1 if quick else 9
    lines = ["| start-up (fresh process) | ms: median (min-max) | RSS growth | peak RSS |",
             "|---|---|---|---|"]
    for label, statement in statements.items():
        f = measure_startup(label, statement, runs)
        lines.append(f"| `{label}` | {f.median_ms:,.0f} ({f.low_ms:,.0f}-{f.high_ms:,.0f}) | "
                     f"{f.rss_mib:,.1f} MiB | {f.peak_mib:,.1f} MiB |")
    lines.append("")
    lines.append(f"{runs} processes each (after one warm-up); `boot()` loads installed plugins "
                 "and uses a new SQLite file (so it imports sqlite-utils to create the schema), "
                 "or, on an *existing database*, the file the warm-up created (a current "
                 "schema: no sqlite-utils).")
    statement = BOOT_STATEMENTS["import datamachine + bootstrap.boot()"]
    breakdown = import_breakdown(statement, 1 if quick else 5)
    lines += ["", "What `import datamachine` + `bootstrap.boot()` imports, by top-level package "
              "(`python -X importtime` own time, median of "
              f"{1 if quick else 5}; the tracing inflates it):", "",
              "| package | ms |", "|---|---|"]
    lines += [f"| `{name}` | {ms:,.1f} |" for name, ms in breakdown]
    return lines


def _short(path: str) -> str:
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1]
    if path.startswith(str(ROOT)):
        return os.path.relpath(path, ROOT)
    return re.sub(r"^.*/lib/python3\.\d+/", "", path)


# Where a turn's time goes, by area: (label, file suffix, function); cumulative time, so an
# area includes what it calls (the provider row is inside the turn runner row).
AREAS = (
    ("provider turn: request, projection, pressure, provider call, answer",
     "conversation/conversation_run.py", "run_turn"),
    ("… of which the running projection and hash", "conversation/projection.py", "sync"),
    ("… of which the scripted provider (the test model)", "providers/scripted.py", "complete"),
    ("tool execution: duplicate check, validation, the tool", "tools/executor.py", "execute"),
    ("completion policy after each tool result", "completion/controller.py", "on_tool_result"),
    ("events (payload merge, sink, hook)", "conversation/events.py", "emit"),
    ("SQLite: append_turn", "storage/transcripts.py", "append_turn"),
    ("SQLite: lock renewal", "storage/transcripts.py", "renew"),
    ("budget pressure", "conversation/pressure.py", "apply"),
    ("run set-up (ConversationRun.create)", "conversation/conversation_run.py", "create"),
)


def _areas(stats: pstats.Stats, total: float) -> list[str]:
    table = stats.stats  # type: ignore[attr-defined]
    lines = ["| area | share of run time (cumulative) |", "|---|---|"]
    for label, suffix, func in AREAS:
        cumulative = sum(entry[3] for (path, _line, name), entry in table.items()
                         if name == func and path.endswith(suffix))
        if cumulative:
            lines.append(f"| {label} | {100 * cumulative / total:.1f}% |")
    return lines


def profile_section(turns: int, quick: bool, top: int = 15) -> list[str]:
    """cProfile of in-memory and all-on runs: where the remaining time goes."""
    from bench import dm_loop

    lines: list[str] = []
    directory = tempfile.TemporaryDirectory(prefix="dm-profile-")
    hosts = [dm_loop.make_host(), dm_loop.make_host(Path(directory.name) / "profile.db")]
    cases = [(BASE_ROW, dm_loop.checked_runner(hosts[0], persist=False)),
             (SQLITE_ROW, dm_loop.checked_runner(hosts[1], persist=True))]
    repeats = 1 if quick else 20
    for label, run in cases:
        run(turns)
        gc.collect()
        gc.freeze()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeats):
            run(turns)
        profiler.disable()
        gc.unfreeze()
        stats = pstats.Stats(profiler, stream=io.StringIO())
        total = stats.total_tt  # type: ignore[attr-defined]
        rows = sorted(stats.stats.items(),  # type: ignore[attr-defined]
                      key=lambda item: item[1][2], reverse=True)[:top]
        lines += [f"**{label}**, T = {turns}, {repeats} runs under cProfile (times inflated "
                  "by the profiler; the shares are what matter):", "",
                  "| function (own time) | calls per turn | share of run time |",
                  "|---|---|---|"]
        calls_per = repeats * (turns + 1)
        for (path, line, func), (_, calls, own, _cum, _) in rows:
            where = f"{_short(path)}:{line}({func})" if line else func
            lines.append(f"| `{where}` | {calls / calls_per:.1f} | {100 * own / total:.1f}% |")
        lines += ["", *_areas(stats, total), ""]
    for host in hosts:
        host.close()
    directory.cleanup()
    return lines


# -- main ---------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> str:
    """Run the sections the arguments ask for; print and return the Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-peers", action="store_true", help="skip the peer frameworks")
    parser.add_argument("--no-boot", action="store_true", help="skip the start-up section")
    parser.add_argument("--no-profile", action="store_true", help="skip the profile section")
    parser.add_argument("--quick", action="store_true",
                        help="T = 2, one run per cell: checks the code, measures nothing")
    parser.add_argument("--out", type=Path, help="also write the Markdown to this file")
    args = parser.parse_args(argv)
    peers = not args.no_peers

    if peers and not _in_bench_venv():
        ensure_environment()
        os.execv(str(_venv_python()), [str(_venv_python()), str(Path(__file__).resolve()),
                                       *(argv if argv is not None else sys.argv[1:])])

    turn_counts = (2,) if args.quick else (10, 50, 200)
    sections: list[str] = ["## Machine", "", *machine_section(), ""]
    if peers:
        from bench.peers import peer_versions

        versions = ", ".join(f"{k} {v}" for k, v in peer_versions().items())
        sections += [f"Peers (pinned in `bench/requirements.txt`): {versions}.", ""]
    sections += ["## Per turn: one tool call per turn for T turns, then an answer", "",
                 *per_turn_section(turn_counts, args.quick, peers), ""]
    levels = (1, 3) if args.quick else (1, 100, 1000)
    sections += ["## Concurrency", "",
                 *concurrency_section(levels, 2 if args.quick else 10, args.quick), ""]
    if not args.no_boot:
        sections += ["## Start-up", "", *boot_section(args.quick, peers), ""]
    if not args.no_profile:
        sections += ["## Profile", "", *profile_section(2 if args.quick else 50, args.quick)]
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    sections.append(f"Load average at the end: {', '.join(f'{x:.2f}' for x in load)}.")
    text = "\n".join(sections) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
