"""Models built from values the code made and checked itself: :func:`unchecked`.

A run builds a few pydantic models from its own values: a message per step, the provider
request every turn, the result once. Validating them again would check what is already known
and cost more than the rest of a turn's bookkeeping, and ``model_construct`` walks every field
in Python (seven microseconds for a result's thirty fields). Copying a template with
``model_copy(update=...)`` sets every field in one dict update, through public pydantic API.

Anything that comes from outside (a user's dict, a model's answer) is validated as usual; this
module is only for values the calling code made.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["unchecked"]

M = TypeVar("M", bound=BaseModel)

# Per class: an empty instance to copy, and the fields whose default is made per instance (a
# list or dict from a default_factory), which every call must set so no two share one.
_templates: dict[type[BaseModel], tuple[BaseModel, frozenset[str]]] = {}


def unchecked(cls: type[M], /, **fields: Any) -> M:
    """An instance of ``cls`` with ``fields`` set, not validated.

    Fields left out take their plain default; a field whose default comes from a
    ``default_factory`` must be given (a ``ValueError`` names it), because the copies would
    otherwise share the template's one list or dict. Required fields must be given too.
    """
    entry = _templates.get(cls)
    if entry is None:
        entry = _templates[cls] = _template(cls)
    template, must_set = entry
    if not fields.keys() >= must_set:
        missing = ", ".join(sorted(must_set - fields.keys()))
        raise ValueError(f"unchecked({cls.__name__}) needs a value for: {missing}.")
    return template.model_copy(update=fields)  # type: ignore[return-value]


def _template(cls: type[BaseModel]) -> tuple[BaseModel, frozenset[str]]:
    must_set = frozenset(
        name for name, info in cls.model_fields.items()
        if info.default_factory is not None or info.is_required())
    return cls.model_construct(), must_set
