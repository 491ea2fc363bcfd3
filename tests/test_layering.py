"""agents_api is the generic substrate: it must never import the product layer."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_agents_api_sources_never_import_datamachine() -> None:
    offenders = []
    for path in (ROOT / "agents_api").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names
                          if n == "datamachine" or n.startswith("datamachine.") or n == "bootstrap"]
    assert offenders == []


def test_importing_agents_api_loads_no_datamachine_module() -> None:
    code = ("import sys, agents_api\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('datamachine', 'bootstrap')]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60).stdout.strip()
    assert out == "[]"


def test_import_datamachine_stays_lazy() -> None:
    code = ("import sys, datamachine\n"
            "heavy = ('pluggy', 'pydantic', 'httpx', 'starlette', 'uvicorn', 'rich',\n"
            "         'sqlite_utils')\n"
            "print([m for m in heavy if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60).stdout.strip()
    assert out == "[]"
