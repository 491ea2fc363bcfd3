"""The hooks and budgets references must match the code: every hook with its exact signature,
every budget registered at boot."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bootstrap
from datamachine import hookspecs

DOCS = Path(__file__).resolve().parent.parent / "docs"


def hookspec_functions() -> dict[str, Callable[..., Any]]:
    return {name: fn for name, fn in vars(hookspecs).items()
            if callable(fn) and hasattr(fn, "datamachine_spec")}


def signature_text(name: str, fn: Callable[..., Any]) -> str:
    """``name(args) -> ret`` as inspect prints it, without module prefixes on type names."""
    text = f"{name}{inspect.signature(fn)}"
    return re.sub(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Za-z_])", "", text)


def documented_sections() -> dict[str, str]:
    text = (DOCS / "hooks.md").read_text()
    parts = re.split(r"^## (\w+)\s*$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_every_hookspec_is_documented_with_its_exact_signature() -> None:
    sections = documented_sections()
    for name, fn in hookspec_functions().items():
        assert name in sections, f"docs/hooks.md has no '## {name}' section"
        expected = signature_text(name, fn)
        assert f"`{expected}`" in sections[name], (
            f"docs/hooks.md section {name!r} must show the signature `{expected}`"
        )


def test_docs_describe_no_hook_that_does_not_exist() -> None:
    assert set(documented_sections()) == set(hookspec_functions())


def test_hook_kind_in_docs_matches_firstresult_flag() -> None:
    sections = documented_sections()
    for name, fn in hookspec_functions().items():
        firstresult = fn.datamachine_spec["firstresult"]  # type: ignore[attr-defined]
        assert ("**firstresult.**" in sections[name]) is firstresult, name


def test_every_registered_budget_is_documented() -> None:
    table = (DOCS / "budgets.md").read_text()
    with bootstrap.boot(db_path=":memory:") as host:
        names = host.budgets.registered_names()
    assert {"conversation_turns", "chain_depth", "tool_calls", "http_fetches"} <= set(names)
    for name in names:
        spec = host.budgets.get_spec(name)
        assert spec is not None
        row = re.search(rf"^\| `{name}` \|(.*)$", table, re.M)
        assert row, f"docs/budgets.md has no table row for budget {name!r}"
        unit, scope, default, low, high, setting = (
            cell.strip() for cell in row.group(1).split("|")[:6])
        high_number = high.split(" or ")[0].replace("10^12", str(10**12)).replace(
            "10^8", str(10**8))
        assert (unit, scope, default, low, high_number, setting) == (
            spec.unit, spec.scope, "unset" if spec.default is None else str(spec.default),
            str(spec.min), str(spec.max), f"`{spec.setting}`"), name
        assert ('"unlimited"' in high) == spec.unlimited, name
