"""The distribution's name and version: one name (``datamachine-agents``, because ``datamachine``
on PyPI is another project) that the package, the command line and every plugin agree on.

Building the wheel and installing it into a fresh environment is ``.ci/wheel-check``.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import distribution
from pathlib import Path

from click.testing import CliRunner

import datamachine
from datamachine.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "datamachine-agents"


def _pyproject(path: Path) -> dict[str, object]:
    project = tomllib.loads(path.read_text())["project"]
    assert isinstance(project, dict)
    return project


def test_pyproject_installed_metadata_and_package_agree_on_name_and_version() -> None:
    project = _pyproject(ROOT / "pyproject.toml")
    installed = distribution(DISTRIBUTION)
    assert project["name"] == installed.metadata["Name"] == DISTRIBUTION
    assert project["version"] == installed.version == datamachine.__version__


def test_version_option_reads_the_installed_distribution() -> None:
    result = CliRunner().invoke(cli, ["--version"], prog_name="datamachine")
    assert result.exit_code == 0, result.output
    assert result.output == f"datamachine, version {datamachine.__version__}\n"


def test_every_plugin_depends_on_the_distribution_not_the_unrelated_pypi_project() -> None:
    plugins = sorted((ROOT / "plugins").glob("*/pyproject.toml"))
    assert len(plugins) >= 4
    for path in plugins:
        requirements = _pyproject(path)["dependencies"]
        assert isinstance(requirements, list)
        names = {re.split(r"[\s\[<>=!~;]", str(req), maxsplit=1)[0] for req in requirements}
        assert DISTRIBUTION in names, path
        assert "datamachine" not in names, path
        sources = tomllib.loads(path.read_text())["tool"]["uv"]["sources"]
        assert sources == {DISTRIBUTION: {"workspace": True}}, path
