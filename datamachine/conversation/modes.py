"""Modes: ``pipeline``, ``chat``, ``system`` and extension modes, normalized one way."""

from __future__ import annotations

import re
from collections.abc import Sequence

from datamachine.errors import UsageError

__all__ = ["BUILTIN_MODES", "normalize_modes"]

BUILTIN_MODES = ("pipeline", "chat", "system")
_UNSAFE = re.compile(r"[^a-z0-9_-]")


def normalize_modes(mode: str | Sequence[str] | None) -> list[str]:
    """Lowercase, keep ``[a-z0-9_-]``, drop empties and repeats; nothing left means pipeline.

    A comma-separated string is a list (``"chat,support"``). Anything that is not a string or a
    list of strings raises :class:`UsageError` naming ``mode``.
    """
    if mode is None:
        items: Sequence[object] = []
    elif isinstance(mode, str):
        items = mode.split(",")
    elif isinstance(mode, list | tuple):
        items = mode
    else:
        raise UsageError(
            f"mode must be a string such as 'pipeline', 'chat' or 'system' (or a list of them), "
            f"got {type(mode).__name__}."
        )
    modes: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"mode entries must be strings, got {item!r}.")
        cleaned = _UNSAFE.sub("", item.strip().lower())
        if cleaned and cleaned not in modes:
            modes.append(cleaned)
    return modes or ["pipeline"]
