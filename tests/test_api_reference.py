"""docs/api.md must cover the public API: every name in ``agents_api.__all__`` and
``datamachine.__all__`` (and ``bootstrap.boot``), with the parameter names the code has.

A name counts as documented when it has a ``### `name` `` heading (optionally with words after
it) or is the first cell of a table row, inside its module's ``## `module` `` section. A
documented callable's signature block (a ```text fence under its heading, starting with
``name(``) must list exactly the code's parameters, in order.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import BaseModel

import agents_api
import bootstrap
import datamachine

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
MODULES: dict[str, ModuleType] = {"bootstrap": bootstrap, "agents_api": agents_api,
                                  "datamachine": datamachine}
PUBLIC: dict[str, list[str]] = {"bootstrap": ["boot"], "agents_api": list(agents_api.__all__),
                                "datamachine": list(datamachine.__all__)}


def module_sections() -> dict[str, str]:
    """``## `module` `` section text by module name."""
    parts = re.split(r"^## `(\w+)`\s*$", API_DOC.read_text(), flags=re.MULTILINE)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def name_sections(section: str) -> dict[str, str]:
    """Each ``### `name` `` heading's text, up to the next heading."""
    parts = re.split(r"^### `(\w+)`.*$", section, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def table_names(section: str) -> set[str]:
    return set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE))


def documented_parameters(block: str, name: str) -> list[str] | None:
    """Parameter names of the ```text signature block starting ``name(``, or None."""
    fence = re.search(r"```text\n(.*?)```", block, flags=re.DOTALL)
    if fence is None or not fence.group(1).startswith(f"{name}("):
        return None
    text = fence.group(1)[len(name) + 1:]
    depth, current, params = 0, "", []
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                params.append(current)
                break
            depth -= 1
        if char == "," and depth == 0:
            params.append(current)
            current = ""
        else:
            current += char
    names = []
    for param in params:
        match = re.match(r"\s*\*{0,2}(\w+)", param)
        if match:  # a bare "*" or "/" marker has no name
            names.append(match.group(1))
    return names


def needs_signature(value: Any) -> bool:
    if inspect.isclass(value):
        return not issubclass(value, BaseException) and not getattr(value, "_is_protocol", False)
    return callable(value)


def is_reexport(module_name: str, name: str, value: Any) -> bool:
    """``datamachine.Decision`` is ``agents_api.Decision``: its signature is checked there."""
    return module_name == "datamachine" and getattr(agents_api, name, None) is value


def code_parameters(value: Any) -> list[str]:
    if isinstance(value, type) and issubclass(value, BaseModel):
        # Models defer their schema build to first use; until then pydantic's signature is
        # only (**data). Building it here makes the check independent of test order.
        value.model_rebuild()
    return list(inspect.signature(value).parameters)


@pytest.mark.parametrize("module_name", list(MODULES))
def test_every_public_name_is_documented(module_name: str) -> None:
    section = module_sections().get(module_name)
    assert section is not None, f"docs/api.md has no '## `{module_name}`' section"
    documented = set(name_sections(section)) | table_names(section)
    missing = [name for name in PUBLIC[module_name] if name not in documented]
    assert not missing, (
        f"docs/api.md does not document {module_name}: {', '.join(missing)}; add a "
        "'### `name`' section (or an errors table row) with its signature and meaning."
    )


@pytest.mark.parametrize("module_name", list(MODULES))
def test_documented_signatures_match_the_code(module_name: str) -> None:
    module = MODULES[module_name]
    sections = name_sections(module_sections()[module_name])
    for name in PUBLIC[module_name]:
        value = getattr(module, name)
        if not needs_signature(value) or is_reexport(module_name, name, value):
            continue
        documented = documented_parameters(sections.get(name, ""), name)
        assert documented is not None, (
            f"docs/api.md: '### `{name}`' needs a ```text signature block starting '{name}('"
        )
        assert documented == code_parameters(value), (
            f"docs/api.md: {module_name}.{name} documents parameters {documented}, "
            f"the code has {code_parameters(value)}"
        )


@pytest.mark.parametrize("module_name", list(MODULES))
def test_docs_describe_no_public_name_that_does_not_exist(module_name: str) -> None:
    headings = set(name_sections(module_sections()[module_name]))
    unknown = sorted(headings - set(PUBLIC[module_name]))
    assert not unknown, f"docs/api.md documents {module_name} names it does not export: {unknown}"


def test_the_parameter_parser_reads_defaults_markers_and_nested_brackets() -> None:
    block = "```text\nf(a, b=(1, 2), /, *, c: dict[str, int] = {}, **rest) -> X\n```"
    assert documented_parameters(block, "f") == ["a", "b", "c", "rest"]
