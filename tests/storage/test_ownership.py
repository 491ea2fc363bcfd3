"""``storage/`` owns the database (DESIGN.md 26): the driver, the migrations and every SQL
statement live under ``datamachine/storage/``; everything else calls a store method. Stores
import neither the task queue nor the server, and nothing sets attributes on a host from
outside its class.

Each rule is checked on the source (``ast``, so an import inside a function counts too), and
the store package's imports once more in a fresh interpreter (what it loads, transitively).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from datamachine.host import Services

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "datamachine"
STORAGE = PACKAGE / "storage"

# What starts an SQL statement (a string constant that begins so, after blanks).
_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE\s+FROM|CREATE\s+(TABLE|INDEX|SCHEMA|FUNCTION)"
                  r"|DROP\s+(TABLE|INDEX)|PRAGMA|ALTER\s+TABLE|BEGIN|COMMIT|ROLLBACK|SAVEPOINT"
                  r"|VACUUM|ANALYZE)\b")
# Modules a store must not import: the task queue and its workers, the server, the host.
_NOT_FOR_STORES = ("datamachine.job_queue", "datamachine.job_worker", "datamachine.server",
                   "datamachine.host", "bootstrap")


def _product_sources() -> Iterator[Path]:
    """The product's modules (the plugins shipped beside it included), storage's excepted."""
    paths = [*PACKAGE.rglob("*.py"), ROOT / "bootstrap.py"]
    paths += list((ROOT / "plugins").glob("*/datamachine_*/**/*.py"))
    return (path for path in sorted(paths) if STORAGE not in path.parents)


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"


def _imported(path: Path, tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Every module ``tree`` imports (at the top, in a function or under TYPE_CHECKING), by
    its full name; ``from package import name`` also yields ``package.name``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield node, base
            for alias in node.names:
                yield node, f"{base}.{alias.name}"


def _is_private_storage(module: str) -> bool:
    parts = module.split(".")
    return parts[:2] == ["datamachine", "storage"] and len(parts) > 2 \
        and parts[2].startswith("_")


def test_no_sql_statement_outside_storage() -> None:
    found = []
    for path in _product_sources():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and _SQL.match(node.value):
                found.append(f"{_where(path, node)}: {node.value.strip()[:60]!r}")
    assert found == [], ("SQL belongs in datamachine/storage/; call (or add) a store method "
                         "instead:\n" + "\n".join(found))


def test_no_storage_internals_imported_outside_storage() -> None:
    found = sorted({f"{_where(path, node)}: {module}"
                    for path in _product_sources()
                    for node, module in _imported(path, _tree(path))
                    if _is_private_storage(module) and not _is_private_storage(
                        module.rpartition(".")[0])})
    assert found == [], ("The driver (storage/_tx.py, _pg.py, ...) is storage's own; use a "
                         "store method:\n" + "\n".join(found))


def test_stores_import_neither_the_queue_nor_the_server() -> None:
    found = sorted({f"{_where(path, node)}: {module}"
                    for path in sorted(STORAGE.rglob("*.py"))
                    for node, module in _imported(path, _tree(path))
                    if any(module == banned or module.startswith(banned + ".")
                           for banned in _NOT_FOR_STORES)})
    assert found == [], ("A store is given its collaborators; it imports none of these:\n"
                         + "\n".join(found))


def test_importing_the_stores_loads_no_queue_server_or_host_module() -> None:
    code = ("import json, sys, datamachine.storage\n"
            "import datamachine.storage.database, datamachine.storage.task_queue\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=60).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert [name for name in loaded
            if any(name == banned or name.startswith(banned + ".")
                   for banned in (*_NOT_FOR_STORES, "procrastinate"))] == []


def _names_a_host(node: ast.expr) -> bool:
    """``host``, ``self.host``, ``state.host``, ...: an expression that is a host."""
    return (isinstance(node, ast.Name) and node.id == "host") or \
        (isinstance(node, ast.Attribute) and node.attr == "host")


def _assigned(tree: ast.Module) -> Iterator[ast.Attribute]:
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute):
                    yield part


def test_nothing_sets_attributes_on_a_host_from_outside() -> None:
    found = []
    for path in _product_sources():
        tree = _tree(path)
        lines = path.read_text().splitlines()
        found += [f"{_where(path, target)}: {lines[target.lineno - 1].strip()}"
                  for target in _assigned(tree) if _names_a_host(target.value)]
        found += [f"{_where(path, node)}: {ast.unparse(node)}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("setattr", "getattr") and node.args
                  and _names_a_host(node.args[0]) and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).startswith("_")]
        found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                  for number, line in enumerate(lines, 1)
                  if "type: ignore[attr-defined]" in line and re.search(r"\bhost\.\w+\s*=", line)]
    assert found == [], ("A host's attributes are its declared fields (datamachine/host.py); "
                         "give what you keep an owner of its own:\n" + "\n".join(found))


def test_the_host_sets_only_its_declared_fields() -> None:
    declared = {field.name for field in dataclasses.fields(Services)}
    found = []
    for path in (PACKAGE / "host.py", PACKAGE / "host.py"):
        for target in _assigned(_tree(path)):
            if isinstance(target.value, ast.Name) and target.value.id == "self" \
                    and target.attr not in declared:
                found.append(f"{_where(path, target)}: self.{target.attr}")
    assert found == [], "declare these as fields of Services:\n" + "\n".join(found)
