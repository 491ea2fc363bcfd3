"""``datamachine docs [TOPIC]``: the documentation that ships inside the package.

A user who installed the wheel has no clone and, until the project has a home page, no URL:
the docs travel in the wheel (``datamachine/_docs``) so every "see docs/providers.md" in a
message can be followed with ``datamachine docs providers``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from datamachine.cli.app import handle_errors
from datamachine.errors import UsageError

__all__ = ["docs", "docs_dir"]


def docs_dir() -> Path | None:
    """Where the pages are: inside the installed package, else (a clone, an editable install)
    the repository's ``docs/``."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "_docs", package.parent / "docs"):
        if (candidate / "index.md").is_file():
            return candidate
    return None


def _title(page: Path) -> str:
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return page.stem


@click.command()
@click.argument("topic", required=False)
@handle_errors
def docs(topic: str | None) -> None:
    """Read the documentation: without TOPIC, the list of pages; with one (`providers`,
    `settings.md`, a unique prefix), that page as Markdown."""
    folder = docs_dir()
    if folder is None:
        raise UsageError("This installation has no documentation pages.")
    pages = sorted(folder.glob("*.md"))
    if topic is None:
        width = max(len(page.stem) for page in pages)
        for page in pages:
            click.echo(f"{page.stem.ljust(width)}  {_title(page)}")
        return
    wanted = topic.removesuffix(".md").removeprefix("docs/").lower()
    exact = [page for page in pages if page.stem == wanted]
    found = exact or [page for page in pages if page.stem.startswith(wanted)]
    if len(found) != 1:
        names = ", ".join(page.stem for page in (found or pages))
        raise UsageError(f"docs: {'several pages start with' if found else 'no page named'} "
                         f"{topic!r} ({names}).")
    text = found[0].read_text(encoding="utf-8")
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        click.echo(text, nl=False)
