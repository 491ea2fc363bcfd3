"""The suite cannot hang: every wait in test code on a process, thread or event has a bound.

pytest-timeout (the README's test command) stops a test that runs too long; this keeps the
waits themselves bounded, so a slow machine fails one test with its own message instead of the
suite waiting on a child that never answers. A wait that is bounded elsewhere (a child process
its parent kills) says so in a comment on its line: ``# bounded: ...`` or ``kill``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_WAITS = {"wait", "join", "communicate"}


def _test_files() -> list[Path]:
    files = list((ROOT / "tests").rglob("*.py"))
    files += list((ROOT / "plugins").glob("*/tests/**/*.py"))
    return sorted(files)


def _unbounded_waits(path: Path) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in _WAITS or node.args or node.keywords:
            continue
        line = lines[node.lineno - 1]
        if "# bounded" in line or "kill" in line.split("#", 1)[-1]:
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {line.strip()}")
    return found


def test_no_wait_in_test_code_is_unbounded() -> None:
    found = [entry for path in _test_files() for entry in _unbounded_waits(path)]
    assert not found, ("waits without a timeout (give one, or say on the line what bounds "
                       "it with '# bounded: ...'):\n" + "\n".join(found))
