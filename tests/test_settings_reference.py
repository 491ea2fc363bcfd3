"""docs/settings.md lists exactly the declared settings, each with its type, default and meaning.

The tables are generated from the declarations; after changing one, print them again with
``.venv/bin/python -m tests.test_settings_reference`` and paste them into the page.
"""

from __future__ import annotations

from pathlib import Path

import bootstrap
from agents_api.jsontext import compact_json
from datamachine.setting_spec import CORE_OWNER, SettingSpec

DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
CORE_START, CORE_END = "<!-- core settings: start -->", "<!-- core settings: end -->"
PLUGIN_START, PLUGIN_END = "<!-- plugin settings: start -->", "<!-- plugin settings: end -->"
# First-party plugins whose settings the page lists (the example plugin is a template).
LISTED_PLUGINS = ("datamachine.default_plugins.remote_agent", "fetch", "mcp")


def _row(spec: SettingSpec, owner: str | None = None) -> str:
    default = "(none)" if spec.default is None else f"`{compact_json(spec.default)}`"
    cells = [f"`{spec.name}`", spec.type_text(), default, spec.description]
    if owner is not None:
        cells.insert(1, owner)
    return "| " + " | ".join(cells) + " |"


def render() -> tuple[str, str]:
    """The core table (the core's and the default plugins' settings) and the plugins' table."""
    with bootstrap.boot(":memory:") as host:
        specs = host.settings.declared()
        owners = {spec.name: host.settings.owner(spec.name) for spec in specs}
    # The tracing plugin is a default plugin where the otel extra is installed (as in dev).
    core_owners = (CORE_OWNER, "datamachine.default_plugins.remote_agent",
                   "datamachine.default_plugins.otel")
    core = ["| setting | type | default | meaning |", "|---|---|---|---|"] + [
        _row(spec) for spec in specs if owners[spec.name] in core_owners]
    plugins = ["| setting | plugin | type | default | meaning |", "|---|---|---|---|---|"] + [
        _row(spec, owners[spec.name]) for spec in specs
        if owners[spec.name] in LISTED_PLUGINS and owners[spec.name] not in core_owners]
    return "\n".join(core), "\n".join(plugins)


def _between(text: str, start: str, end: str) -> str:
    for marker in (start, end):
        assert marker in text, f"docs/settings.md needs the marker {marker}"
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_settings_page_lists_exactly_the_declared_settings() -> None:
    text = DOC.read_text()
    core, plugins = render()
    assert _between(text, CORE_START, CORE_END) == core, (
        "docs/settings.md is out of date: print the tables with "
        "`.venv/bin/python -m tests.test_settings_reference` and paste them in")
    assert _between(text, PLUGIN_START, PLUGIN_END) == plugins


def test_the_core_table_has_the_settings_a_reader_looks_for() -> None:
    core, _ = render()
    for name in ("max_turns", "site_id", "allow_model_requests", "remote_sites",
                 "request_timeout", "chat_rate_limit"):
        assert f"| `{name}` |" in core


if __name__ == "__main__":
    for block in render():
        print(block, end="\n\n")
