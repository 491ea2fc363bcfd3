"""The seam stays typed and wired once (DESIGN.md 26): collaborators are passed to
constructors, never assigned after, and no attribute is forced onto an object mypy would refuse.

An attribute set on another object's attribute (``run.runner.stream_text = ...``,
``executor.approved_call = ...`` through a holder) wires a collaborator after construction and
hides who talks to whom; so does an attribute set on a function (``emit.active = ...``). The
few objects that are state by nature are listed with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agents_api", "datamachine")

# (file, the object whose attributes are set): state by nature, not a collaborator.
STATE = {
    ("datamachine/storage/_pg.py", "self._local"): "a thread-local: each thread's transaction",
    ("datamachine/storage/stored_settings.py", "self._batch"): "a thread-local batch flag",
    ("datamachine/server/app.py", "app.state"): "Starlette's documented per-app state",
    ("datamachine/server/app.py", "app.router"): "Starlette's lifespan, set as its docs say",
}


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def _functions(tree: ast.AST) -> set[str]:
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _wired_after(path: Path) -> list[str]:
    relative = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text())
    functions = _functions(tree)
    found = []
    for node in ast.walk(tree):
        for target in _targets(node):
            for sub in ast.walk(target):
                if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)):
                    continue
                holder = ast.unparse(sub.value)
                nested = isinstance(sub.value, ast.Attribute)
                on_function = isinstance(sub.value, ast.Name) and sub.value.id in functions
                if (nested or on_function) and (relative, holder) not in STATE:
                    found.append(f"{relative}:{target.lineno}: {ast.unparse(target)}")
    return found


def test_no_collaborator_is_assigned_after_construction() -> None:
    found = [entry for path in _sources() for entry in _wired_after(path)]
    assert not found, ("attributes set on another object's collaborator or on a function: "
                       "pass them to the constructor (or make them a hook):\n"
                       + "\n".join(found))


def test_no_attribute_is_forced_past_the_type_checker() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in _sources()
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if "type: ignore[attr-defined]" in line]
    assert not found, ("an attribute mypy does not know is set or read: declare it (a field, "
                       "a protocol) instead of silencing the check:\n" + "\n".join(found))
