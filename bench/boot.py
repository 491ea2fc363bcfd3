"""Start-up cost: ``import datamachine`` and ``bootstrap.boot()``, beside the peers' imports.

Each figure comes from fresh interpreters (one per sample, so nothing is cached in memory
between samples; the OS file cache is warm after the first). The child times its own statement
with ``perf_counter`` (interpreter start-up excluded) and reports how much its peak resident
memory grew while the statement ran, and that peak.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BOOT_STATEMENTS", "ON_EXISTING_DATABASE", "PEER_IMPORTS", "StartupFigures",
           "import_breakdown", "measure_startup"]

# Memory comes from /proc/self/status: VmHWM is this process's own peak, whereas ru_maxrss
# survives fork and exec and would report the (larger) parent's peak.
_CHILD = """
import json, time
def kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
before = kib("VmRSS:")
start = time.perf_counter()
{statement}
elapsed = time.perf_counter() - start
print(json.dumps({{"ms": elapsed * 1e3, "rss_kib": kib("VmHWM:") - before,
                  "peak_kib": kib("VmHWM:")}}))
"""

_BOOT = ("import datamachine, bootstrap, os\n"
         "host = bootstrap.boot(db_path=os.environ['BENCH_BOOT_DB'])")
BOOT_STATEMENTS = {
    "import datamachine": "import datamachine",
    "import datamachine + bootstrap.boot()": _BOOT,
    "import datamachine + bootstrap.boot(), existing database": _BOOT,
}
# Statements timed against one database file that the untimed warm-up process created (what
# every start after an application's first one does); the others get a new file each time.
ON_EXISTING_DATABASE = frozenset({"import datamachine + bootstrap.boot(), existing database"})
PEER_IMPORTS = {
    "import pydantic_ai": "import pydantic_ai",
    "import agents (openai-agents)": "import agents",
    "import langgraph.prebuilt": "import langgraph.prebuilt",
}


@dataclass(frozen=True)
class StartupFigures:
    """Milliseconds (median, min, max over fresh processes); RSS growth and peak in MiB."""

    label: str
    median_ms: float
    low_ms: float
    high_ms: float
    rss_mib: float
    peak_mib: float


def measure_startup(label: str, statement: str, runs: int,
                    python: str = sys.executable) -> StartupFigures:
    """Run ``statement`` in ``runs`` fresh ``python`` processes (plus one untimed warm-up).

    ``$BENCH_BOOT_DB`` names a new file for each process, or for a label in
    :data:`ON_EXISTING_DATABASE` the one file the warm-up created.
    """
    samples: list[dict[str, float]] = []
    existing = label in ON_EXISTING_DATABASE
    with tempfile.TemporaryDirectory() as directory:
        for index in range(runs + 1):
            name = "boot.db" if existing else f"boot{index}.db"
            env = dict(os.environ, BENCH_BOOT_DB=str(Path(directory) / name))
            out = subprocess.run([python, "-c", _CHILD.format(statement=statement)], env=env,
                                 cwd=directory, capture_output=True, text=True, check=True)
            if index:
                samples.append(json.loads(out.stdout.strip().splitlines()[-1]))
    times = [s["ms"] for s in samples]
    rss = statistics.median(s["rss_kib"] for s in samples) / 1024
    peak = statistics.median(s["peak_kib"] for s in samples) / 1024
    return StartupFigures(label, statistics.median(times), min(times), max(times), rss, peak)


def import_breakdown(statement: str, runs: int, python: str = sys.executable,
                     top: int = 8) -> list[tuple[str, float]]:
    """Milliseconds of ``python -X importtime`` self time per top-level package (median).

    ``-X importtime`` slows imports down a little, so these add up to more than the plain
    timing; they say which packages the time goes to.
    """
    per_run: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as directory:
        for index in range(runs):
            env = dict(os.environ, BENCH_BOOT_DB=str(Path(directory) / f"imp{index}.db"))
            out = subprocess.run([python, "-X", "importtime", "-c", statement], env=env,
                                 cwd=directory, capture_output=True, text=True, check=True)
            totals: dict[str, float] = {}
            for line in out.stderr.splitlines():
                parts = line.split("|")
                if len(parts) != 3 or not parts[0].startswith("import time:"):
                    continue
                try:
                    own = int(parts[0].split(":")[1])
                except ValueError:
                    continue  # the header line
                package = parts[2].strip().split(".")[0]
                totals[package] = totals.get(package, 0.0) + own / 1000
            per_run.append(totals)
    names = {name for totals in per_run for name in totals}
    medians = {name: statistics.median(t.get(name, 0.0) for t in per_run) for name in names}
    return sorted(medians.items(), key=lambda item: item[1], reverse=True)[:top]
