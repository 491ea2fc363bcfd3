"""Public names that load on first use (PEP 562), for the packages' ``__init__`` modules.

Importing a package then costs only its own module: a host that boots (registers budgets, opens
storage) never pays for the loop, the executor or their pydantic models until a run needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str], namespace: MutableMapping[str, object],
                 public: list[str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__``: ``exports`` maps each lazy name to the
    module defining it; a loaded name is kept in ``namespace`` so it loads once."""

    def __getattr__(name: str) -> object:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__
