"""Modes: ``pipeline``, ``chat``, ``system`` and extension modes, checked one way.

An extension mode exists when a plugin declares it (the ``register_modes`` hook): a run that
names any other mode is a UsageError naming the closest known one, so ``--mode nope`` or a
misspelt ``"suport"`` fails before anything runs instead of quietly behaving like ``chat``.

A mode name is what the ``/chat`` body's ``mode`` accepts (``MODE_PATTERN``); the Python API
takes the same names, and also several at once. A name outside the pattern is refused, never
rewritten: ``"Chat!"`` used to become ``chat`` and ``"???"`` silently ``pipeline`` here while
``/chat`` refused both.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Sequence
from typing import Any

from agents_api.errors import brief_repr
from datamachine.errors import PluginLoadError, UsageError

__all__ = ["BUILTIN_MODES", "MODE_PATTERN", "check_known_modes", "check_modes", "collect_modes"]

BUILTIN_MODES = ("pipeline", "chat", "system")
# A mode name: lowercase letters, digits and "_", starting with a letter, at most 64 characters.
MODE_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_MODE_RE = re.compile(MODE_PATTERN)


def check_modes(mode: object) -> list[str]:
    """The run's modes: ``mode`` is a mode name, several joined by commas (``"chat,support"``)
    or a list of names. Each name is lowercase letters, digits and ``_``, starting with a
    letter, at most 64 characters (``MODE_PATTERN``), named once; anything else (None
    included: leave the argument out for ``pipeline``) is a UsageError naming ``mode``, never
    rewritten into some other mode."""
    if mode is None:
        raise UsageError("mode is None: name the run's mode ('pipeline', 'chat', 'system' or "
                         "an extension mode), or leave the argument out for 'pipeline'.")
    if isinstance(mode, str):
        items: Sequence[object] = mode.split(",")
    elif isinstance(mode, list | tuple):
        items = mode
        if not items:
            raise UsageError("mode is an empty list: name at least one mode, such as "
                             "'pipeline', 'chat' or 'system'.")
    else:
        raise UsageError(
            f"mode must be a string such as 'pipeline', 'chat' or 'system' (or a list of them), "
            f"got {type(mode).__name__}.")
    modes: list[str] = []
    for item in items:
        if not isinstance(item, str) or not _MODE_RE.fullmatch(item):
            raise UsageError(
                f"mode {brief_repr(item)} is not a mode name: use lowercase letters, digits and "
                "'_', starting with a letter, at most 64 characters (for example 'chat' or "
                "'support_bot'); give several as a list or joined by commas without spaces.")
        if item in modes:
            raise UsageError(f"mode names {item!r} twice: give each mode once, such as "
                             "['support', 'chat'].")
        modes.append(item)
    return modes


def collect_modes(pm: Any) -> dict[str, str]:
    """Every mode a host accepts, ``{mode: owner}``: the built-in ones, then each plugin's
    ``register_modes()`` names. Two plugins may declare one mode (a shared vocabulary); the
    first keeps the ownership. A name outside ``MODE_PATTERN`` fails the boot."""
    from datamachine.plugins import collect

    modes = dict.fromkeys(BUILTIN_MODES, "datamachine")
    for plugin_name, item in collect(pm, "register_modes"):
        if not isinstance(item, str) or not _MODE_RE.fullmatch(item):
            raise PluginLoadError(
                f"Plugin {plugin_name!r}: register_modes() returned {brief_repr(item)}, which is "
                "not a mode name (lowercase letters, digits and '_', starting with a letter, at "
                "most 64 characters).")
        modes.setdefault(item, plugin_name)
    return modes


def check_known_modes(modes: Sequence[str], known: Collection[str]) -> None:
    """Refuse a mode nobody declared, naming the closest known one and how to declare it."""
    for mode in modes:
        if mode in known:
            continue
        close = difflib.get_close_matches(mode, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"mode {mode!r} is not a known mode: {hint}the modes are "
            f"{', '.join(sorted(known))}. A plugin declares an extension mode with the "
            "register_modes hook (`datamachine docs modes`).", field="mode")
