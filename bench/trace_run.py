"""How many project modules one run walks through, and how often it bounces between them.

``python3 bench/trace_run.py`` (``--turns N``, ``--json``, ``--list``): one run of the
``openai`` provider against the bench's loopback Chat Completions server (its own process),
one ``@datamachine.tool``, the transcript in a temporary SQLite file, ``N`` tool turns (default
1: a 2-turn run) then the answer. One warm-up run first, so imports are not counted; the
second run is traced with :func:`sys.setprofile` from ``host.run_conversation`` to its return.

What it counts, over Python calls into the project's own code (``agents_api/``,
``datamachine/``, ``bootstrap.py``; plugins, tests and libraries are not counted, but a
library calling back into the project is):

* **calls**: project functions entered;
* **modules**: distinct project modules entered;
* **switches**: successive calls in different modules (the run's path, call by call);
* **bounces**: A -> B -> A in that path, once successive calls in one module are merged into
  one visit: a module that hands work to another and gets it straight back;
* **seam crossings**: switches between ``agents_api`` and ``datamachine``;
* **before the loop**: modules and calls before the loop's run object starts its first turn;
* **settings reads**: calls of ``Settings.get``.

A readable run is one whose path a person can follow: fewer modules and fewer bounces mean
fewer places to look. Issue 35 bounds a 2-turn run at 35 modules and 25 bounces.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.http_bench import MODEL, prompt, start_server  # noqa: E402
from bench.scenario import answer_text, double  # noqa: E402

_PROJECT = (str(ROOT / "agents_api") + os.sep, str(ROOT / "datamachine") + os.sep,
            str(ROOT / "bootstrap.py"))
# The first call of these starts the loop's turns ("before the loop" ends there).
_LOOP_START = ("_turn",)


def _module_of(filename: str) -> str | None:
    if not filename.startswith(_PROJECT):
        return None
    relative = Path(filename).relative_to(ROOT).with_suffix("")
    return ".".join(relative.parts)


class Tracer:
    """The profile function and what it counted."""

    def __init__(self) -> None:
        self.sequence: list[str] = []  # the module of every project call, in order
        self.settings_reads = 0
        self.before_loop: tuple[int, int] | None = None
        self._cache: dict[str, str | None] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if filename not in self._cache:
            self._cache[filename] = _module_of(filename)
        module = self._cache[filename]
        if module is None:
            return
        name = frame.f_code.co_name
        if frame.f_code.co_qualname == "Settings.get" and module == "datamachine.settings":
            self.settings_reads += 1
        if self.before_loop is None and name in _LOOP_START and module.startswith("agents_api"):
            self.before_loop = (len(set(self.sequence)), len(self.sequence))
        self.sequence.append(module)

    def report(self) -> dict[str, Any]:
        sequence = self.sequence
        # Consecutive calls in one module are one visit; a bounce is a visit to A, then B,
        # then A again.
        visits = [m for i, m in enumerate(sequence) if i == 0 or sequence[i - 1] != m]
        bounces: Counter[str] = Counter(
            f"{a} -> {b} -> {a}" for a, b, c in zip(visits, visits[1:], visits[2:], strict=False)
            if a == c)
        seam = sum(1 for a, b in itertools.pairwise(visits)
                   if a.split(".")[0] != b.split(".")[0])
        return {
            "calls": len(sequence), "modules": len(set(sequence)),
            "switches": len(visits) - 1 if visits else 0, "bounces": sum(bounces.values()),
            "seam_crossings": seam, "settings_reads": self.settings_reads,
            "before_loop": ({"modules": self.before_loop[0], "calls": self.before_loop[1]}
                            if self.before_loop else None),
            "modules_entered": dict(sorted(Counter(sequence).items())),
            "bounce_pairs": dict(bounces.most_common()),
        }


def trace(turns: int) -> dict[str, Any]:
    import bootstrap
    import datamachine

    server, base_url = start_server()
    os.environ.setdefault("OPENAI_API_KEY", "bench")
    try:
        with tempfile.TemporaryDirectory() as folder:
            host = bootstrap.boot(db_path=Path(folder) / "trace.db", load_entrypoints=False)
            host.settings.set("openai_base_url", base_url)
            tool = datamachine.tool(double)

            def run() -> None:
                result = host.run_conversation(
                    [{"role": "user", "content": prompt(turns)}], [tool], "openai", MODEL)
                if result.final_content != answer_text(turns):
                    raise RuntimeError(f"the traced run went wrong: {result.status} "
                                       f"{result.error}")

            run()  # warm: imports, the connection pool, first-use caches
            tracer = Tracer()
            sys.setprofile(tracer)
            try:
                run()
            finally:
                sys.setprofile(None)
            host.close()
    finally:
        server.kill()
        server.wait(timeout=10)
    return tracer.report()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1, help="tool turns before the answer")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    parser.add_argument("--list", action="store_true", help="list modules and bounce pairs")
    args = parser.parse_args(argv)
    report = trace(args.turns)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    before = report["before_loop"] or {"modules": "?", "calls": "?"}
    print(f"a {args.turns + 1}-turn run: {report['calls']} project calls in "
          f"{report['modules']} modules, {report['switches']} module switches, "
          f"{report['bounces']} bounces (A->B->A), {report['seam_crossings']} seam crossings, "
          f"Settings.get {report['settings_reads']} times; before the loop: "
          f"{before['modules']} modules, {before['calls']} calls")
    if args.list:
        for module, count in report["modules_entered"].items():
            print(f"  {count:5d}  {module}")
        print("bounces:")
        for pair, count in report["bounce_pairs"].items():
            print(f"  {count:5d}  {pair}")


if __name__ == "__main__":
    main()
