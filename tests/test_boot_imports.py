"""Booting a host loads only what boot uses (DESIGN.md section 9: imports stay lazy).

Each test boots in a fresh interpreter and lists the modules that must still be absent, so a
new eager import on the boot path fails here instead of quietly slowing every start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Not needed to boot a host: the network client, the web server, rich, the loop and what only a
# run uses.
NOT_AT_BOOT = (
    "openai", "httpx", "starlette", "uvicorn", "rich",
    "agents_api.loop", "agents_api.results", "agents_api.drive", "agents_api.api",
    "datamachine.api", "datamachine.conversation", "datamachine.completion",
    "datamachine.tools.executor", "datamachine.tools.runtime_rules",
    "datamachine.tools.history", "datamachine.tools.duplicates",
    "datamachine.server.chain", "datamachine.server.app",
    "datamachine.providers.openai_wire", "datamachine.providers.chat_messages",
)


def _modules_after(code: str, tmp_path: Path) -> set[str]:
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60,
                         env={**os.environ, "BOOT_DB": str(tmp_path / "boot.db")}).stdout
    return set(json.loads(out.strip().splitlines()[-1]))


def test_boot_with_installed_plugins_loads_no_run_machinery(tmp_path: Path) -> None:
    loaded = _modules_after(
        "import os, datamachine, bootstrap\n"
        "host = bootstrap.boot(db_path=os.environ['BOOT_DB'])\n"
        "assert 'fetch_url' in host.tools.names()\n", tmp_path)
    assert sorted(name for name in NOT_AT_BOOT if name in loaded) == []


def test_lazy_packages_still_export_every_public_name(tmp_path: Path) -> None:
    loaded = _modules_after(
        "import agents_api, datamachine.tools\n"
        "for package in (agents_api, datamachine.tools):\n"
        "    for name in package.__all__:\n"
        "        getattr(package, name)\n", tmp_path)
    assert {"agents_api.loop", "datamachine.tools.executor"} <= loaded


def test_boot_on_a_current_database_does_not_import_sqlite_utils(tmp_path: Path) -> None:
    boot = ("import os, datamachine, bootstrap\n"
            "host = bootstrap.boot(db_path=os.environ['BOOT_DB'])\n")
    first = _modules_after(boot, tmp_path)  # a new file: the migrations need sqlite-utils
    assert "sqlite_utils" in first
    again = _modules_after(boot + "assert host.settings.get('site_id')\n", tmp_path)
    assert not {"sqlite_utils", "click", "dateutil"} & {m.split(".")[0] for m in again}
    # Reading host.db still gives sqlite-utils' Database, on the same connection.
    used = _modules_after(boot + "assert host.db.conn is host.handle.conn\n"
                          "assert 'settings' in host.db.table_names()\n", tmp_path)
    assert "sqlite_utils" in used
