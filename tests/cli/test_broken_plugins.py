"""An installed plugin that fails to load is one warning line; every command still works.

The broken plugins are real installed distributions as far as ``importlib.metadata`` knows: a
``*.dist-info`` directory with an ``entry_points.txt`` on ``sys.path`` (``PYTHONPATH`` for the
subprocesses), which is all an installed wheel amounts to for entry-point discovery.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import bootstrap
from datamachine import PluginLoadWarning

PLUGINS = {
    # distribution: (module source, entry point name)
    "dm-broken-import": ("import no_such_module_anywhere\n", "broken_import"),
    "dm-misspelled": ("from datamachine import hookimpl\n\n\n"
                      "@hookimpl\ndef regster_tools():\n    return []\n", "misspelled"),
    "dm-bad-commands": ("from datamachine import hookimpl\n\n\n"
                        "@hookimpl\ndef register_commands(cli):\n"
                        "    raise RuntimeError('cannot add commands today')\n", "bad_commands"),
}


def _install_fake(site: Path, dist: str, source: str, ep_name: str) -> None:
    module = dist.replace("-", "_")
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[datamachine]\n{ep_name} = {module}\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    for dist, (source, ep_name) in PLUGINS.items():
        _install_fake(folder, dist, source, ep_name)
    return folder


def _cli(site: Path, db: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith("DATAMACHINE_")}
    environ.update({"PYTHONPATH": str(site), "DATAMACHINE_DB": str(db), **env})
    return subprocess.run([sys.executable, "-m", "datamachine", *args], capture_output=True,
                          text=True, env=environ, timeout=60, check=False)


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Warning: ")]


def test_help_version_and_a_run_work_with_one_line_per_broken_plugin(
        site: Path, tmp_path: Path) -> None:
    # A plugin that failed to import used to crash every command, --help included, with a
    # traceback.
    shown = _cli(site, tmp_path / "d.db", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "Usage:" in shown.stdout
    lines = _warning_lines(shown.stderr)
    assert len(lines) == 3, shown.stderr
    assert "Traceback" not in shown.stderr
    broken = next(line for line in lines if "'broken_import'" in line)
    assert "dm-broken-import 0.1" in broken
    assert "ModuleNotFoundError" in broken
    assert "no_such_module_anywhere" in broken
    assert "DATAMACHINE_LOAD_PLUGINS" in broken
    misspelled = next(line for line in lines if "'misspelled'" in line)
    assert "regster_tools" in misspelled
    assert "DATAMACHINE_LOAD_PLUGINS" in misspelled
    commands = next(line for line in lines if "'bad_commands'" in line)
    assert "cannot add commands today" in commands

    version = _cli(site, tmp_path / "d.db", "--version")
    assert version.returncode == 0
    assert "version" in version.stdout

    ran = _cli(site, tmp_path / "d.db", "run", "hello", "--json")
    assert ran.returncode == 0, ran.stderr
    assert '"final_content": "echo: hello"' in ran.stdout
    # Each broken plugin is reported once, though the process builds two plugin managers.
    assert len(_warning_lines(ran.stderr)) == 3, ran.stderr
    assert "Traceback" not in ran.stderr


def test_load_plugins_leaves_the_broken_ones_out_quietly(site: Path, tmp_path: Path) -> None:
    ran = _cli(site, tmp_path / "d.db", "plugins", DATAMACHINE_LOAD_PLUGINS="")
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr == ""


def test_the_python_api_skips_a_broken_plugin_with_a_plugin_load_warning(
        site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    monkeypatch.setenv("DATAMACHINE_LOAD_PLUGINS", "dm-broken-import,dm-misspelled")
    with pytest.warns(PluginLoadWarning) as caught:
        host = bootstrap.boot(db_path=":memory:")
    try:
        assert sorted(str(w.message).split("'")[1] for w in caught) == [
            "broken_import", "misspelled"]
        assert "misspelled" not in host.plugins
        assert host.run_conversation([{"role": "user", "content": "hi"}]).status == "completed"
    finally:
        host.close()
    # An app that must not run without its plugins makes the warning an error.
    with warnings.catch_warnings():
        warnings.simplefilter("error", PluginLoadWarning)
        with pytest.raises(PluginLoadWarning, match="broken_import"):
            bootstrap.boot(db_path=":memory:")


def test_a_plugin_whose_registration_raises_is_one_line_naming_the_way_out(
        tmp_path: Path) -> None:
    # A register_settings() (or register_tools, host_started) that raised printed a traceback
    # for every command that boots a host.
    folder = tmp_path / "site"
    folder.mkdir()
    for dist, hook, args in (("dm-raises-settings", "register_settings", ""),
                             ("dm-raises-start", "host_started", "host")):
        source = (f"from datamachine import hookimpl\n\n\n@hookimpl\ndef {hook}({args}):\n"
                  f"    raise RuntimeError('{hook} is broken today')\n")
        _install_fake(folder, dist, source, dist.replace("-", "_"))
    for dist, hook in (("dm-raises-settings", "register_settings"),
                       ("dm-raises-start", "host_started")):
        done = _cli(folder, tmp_path / "d.db", "settings", "list",
                    DATAMACHINE_LOAD_PLUGINS=dist)
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        [line] = done.stderr.splitlines()
        assert f"failed in {hook}()" in line
        assert f"{hook} is broken today" in line
        assert "DATAMACHINE_LOAD_PLUGINS" in line
        assert _cli(folder, tmp_path / "d.db", "--help",
                    DATAMACHINE_LOAD_PLUGINS=dist).returncode == 0
    fine = _cli(folder, tmp_path / "d.db", "settings", "get", "max_turns",
                DATAMACHINE_LOAD_PLUGINS="")
    assert fine.stdout.strip() == "25"
