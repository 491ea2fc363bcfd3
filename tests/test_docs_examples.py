"""Every ```python block in README.md and docs/ runs, so the examples cannot rot.

Blocks of one file run in order in one namespace (later blocks may use earlier names). A block
opts out only with an explicit ``<!-- no-run -->`` line right before its opening fence.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?P<marker><!-- no-run -->\s*\n)?```python\n(?P<code>.*?)```", re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return [m["code"] for m in FENCE.finditer(path.read_text()) if not m["marker"]]


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_python_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.name} has no python examples")
    monkeypatch.chdir(tmp_path)
    from datamachine.api import reset_default_host

    reset_default_host()
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    try:
        for index, code in enumerate(blocks, start=1):
            try:
                exec(compile(code, f"{path.name}[block {index}]", "exec"), namespace)
            except Exception as exc:
                message = f"{path.name} python block {index} failed: {exc!r}\n{code}"
                raise AssertionError(message) from exc
    finally:
        reset_default_host()


def test_every_doc_with_code_has_runnable_python() -> None:
    # A file whose only python blocks are opted out would hide rot; flag it.
    for path in DOC_FILES:
        text = path.read_text()
        if "```python" in text:
            assert python_blocks(path), f"{path.name}: every python block is marked no-run"
