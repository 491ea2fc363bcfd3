"""``bootstrap.boot``: the entry point this project's docs and tests have always used.

The code lives in :mod:`datamachine.booting`, and ``datamachine.boot`` is the same function.
Nothing inside ``datamachine`` imports this module, so an application's own ``bootstrap.py``
(a common name) earlier on ``sys.path`` never breaks the library.
"""

from __future__ import annotations

from datamachine.booting import boot

__all__ = ["boot"]
