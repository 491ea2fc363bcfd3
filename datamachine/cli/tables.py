"""Tables for people on a terminal, and for ``grep`` and ``cut`` when piped: :func:`table`.

An id in a table is what a person copies into the next command, so on a terminal the id columns
are never cut: the other columns give way, in a fixed order (:func:`fit_columns`).
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import click

__all__ = ["Column", "fit_columns", "table"]


# Spaces between two columns of a table, on a terminal and in plain text alike.
_GAP = 2
# The narrowest a column that may be cut gets on a terminal (its header stays whole).
_MIN_WIDTH = 6


def table(headers: list[str], rows: list[list[Any]], *, whole: Collection[str] = ("id",),
          clip: Collection[str] = (), optional: Sequence[str] = ()) -> None:
    """A table: on a terminal a rich table no wider than the terminal; piped, aligned plain
    text (easy to grep and cut) with every column and every cell whole.

    On a terminal the columns named in ``whole`` (ids, names a person copies into the next
    command) are never cut, wrapped or folded. To fit, first the ``clip`` columns (one-line
    descriptions) shrink, ending in an ellipsis; then the other columns wrap between words;
    then the ``optional`` columns are left out, the last one first; then the others' long words
    end in an ellipsis. When even that does not fit, the plain text is printed.
    """
    cells = [[str(c) for c in row] for row in rows]
    natural = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    if sys.stdout.isatty():
        from rich.console import Console

        console = Console()
        columns = [Column(h, natural[i], _longest_word([h] + [r[i] for r in cells]),
                          "whole" if h in whole else "clip" if h in clip else "wrap")
                   for i, h in enumerate(headers)]
        widths = fit_columns(columns, console.width, drop_order=list(reversed(optional)))
        if widths is not None:
            console.print(_rich_table(columns, cells, widths))
            return
    click.echo((" " * _GAP).join(h.ljust(w) for h, w in zip(headers, natural, strict=True))
               .rstrip())
    for row in cells:
        click.echo((" " * _GAP).join(c.ljust(w) for c, w in zip(row, natural, strict=True))
                   .rstrip())


@dataclass(frozen=True)
class Column:
    """One column of :func:`table` as :func:`fit_columns` sizes it."""

    header: str
    natural: int  # the longest cell, header included
    longest_word: int
    kind: str  # "whole", "clip" or "wrap"


def _longest_word(texts: list[str]) -> int:
    return max([len(word) for text in texts for word in text.split()] or [0])


def fit_columns(columns: Sequence[Column], available: int,
                drop_order: Sequence[str] = ()) -> list[int | None] | None:
    """Each column's width on a terminal ``available`` characters wide (None: left out), in
    the order :func:`table` describes; None when the table cannot fit."""
    widths: list[int | None] = [c.natural for c in columns]
    header_floor = [max(len(word) for word in c.header.split()) if c.header.strip() else 0
                    for c in columns]

    def excess() -> int:
        shown = [w for w in widths if w is not None]
        return sum(shown) + _GAP * (len(shown) - 1) - available

    def shrink(kind: str, floor: list[int]) -> None:
        while excess() > 0:
            candidates = [i for i, c in enumerate(columns) if c.kind == kind
                          and (w := widths[i]) is not None and w > floor[i]]
            if not candidates:
                return
            widest = max(candidates, key=lambda i: widths[i] or 0)
            widths[widest] = (widths[widest] or 0) - 1

    hard = [min(c.natural, max(_MIN_WIDTH, header_floor[i])) for i, c in enumerate(columns)]
    shrink("clip", hard)
    shrink("wrap", [max(hard[i], min(c.natural, c.longest_word))
                    for i, c in enumerate(columns)])
    dropped = False
    for name in drop_order:
        if excess() <= 0:
            break
        for i, column in enumerate(columns):
            if column.header == name and column.kind != "whole":
                widths[i] = None
                dropped = True
    if dropped:  # the room a left-out column freed goes back to the shrunk ones
        while excess() < 0:
            short = [i for i, c in enumerate(columns)
                     if (w := widths[i]) is not None and w < c.natural]
            if not short:
                break
            neediest = max(short, key=lambda i: columns[i].natural - (widths[i] or 0))
            widths[neediest] = (widths[neediest] or 0) + 1
    shrink("wrap", hard)
    return widths if excess() <= 0 else None


def _rich_table(columns: Sequence[Column], cells: list[list[str]],
                widths: list[int | None]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    shown = Table(header_style="bold", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  collapse_padding=True)
    kept = [i for i, width in enumerate(widths) if width is not None]
    for i in kept:
        column = columns[i]
        # A wrapped column breaks between words; only a word longer than the column is cut.
        shown.add_column(column.header, width=widths[i], no_wrap=column.kind != "wrap",
                         overflow="fold" if column.kind == "whole" else "ellipsis")
    for row in cells:
        # Text, never markup: a value like "[/x]" or "[red]" (a setting, an MCP tool's
        # description, a transcript id) is shown as it is, not parsed.
        shown.add_row(*[Text(row[i]) for i in kept])
    return shown
