"""Building pydantic models from trusted values, cheaply: :func:`construct`.

``BaseModel.model_construct`` skips validation but still walks every field's aliases on every
call and, for each field left out, asks pydantic for its default, which inspects the default
factory's signature each time. On the loop's hot path (a few messages and one turn result per
turn, one result per run) that bookkeeping costs more than the object. :func:`construct` builds
the same instance (same ``__dict__`` in field order, same ``model_fields_set``) from a plan
worked out once per class.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["construct", "construct_all"]

M = TypeVar("M", bound=BaseModel)

# Per field: name, whether it is required, its default, its default factory and whether that
# factory takes the values built so far.
_Plan = tuple[tuple[str, bool, Any, Callable[..., Any] | None, bool], ...]
_plans: dict[type[BaseModel], _Plan | None] = {}
_IMMUTABLE = (type(None), str, int, float, bool, bytes)
_set_attr = object.__setattr__


def _plan(cls: type[BaseModel]) -> _Plan | None:
    if (cls.__pydantic_post_init__ or cls.__pydantic_root_model__
            or cls.model_config.get("extra") == "allow"):
        return None  # rare shapes: let pydantic do it
    plan = []
    for name, field in cls.__pydantic_fields__.items():
        factory = field.default_factory
        takes_data = factory is not None and field.default_factory_takes_validated_data
        plan.append((name, field.is_required(), field.default, factory, bool(takes_data)))
    return tuple(plan)


def construct(cls: type[M], /, **values: Any) -> M:
    """``cls.model_construct(**values)`` for values given by field name (not by alias)."""
    try:
        plan = _plans[cls]
    except KeyError:
        plan = _plans[cls] = _plan(cls)
    if plan is None:
        return cls.model_construct(**values)
    fields: dict[str, Any] = {}
    given: set[str] = set()
    for name, required, default, factory, takes_data in plan:
        if name in values:
            fields[name] = values[name]
            given.add(name)
        elif required:
            continue
        elif factory is not None:
            fields[name] = factory(fields) if takes_data else factory()
        else:
            fields[name] = default if isinstance(default, _IMMUTABLE) else copy.deepcopy(default)
    instance = cls.__new__(cls)
    _set_attr(instance, "__dict__", fields)
    _set_attr(instance, "__pydantic_fields_set__", given)
    _set_attr(instance, "__pydantic_extra__", None)
    _set_attr(instance, "__pydantic_private__", None)
    return instance


def construct_all(cls: type[M], fields: dict[str, Any], /) -> M:
    """Like :func:`construct` when ``fields`` names every field, in declaration order.

    The dict becomes the instance's ``__dict__`` as is (the caller hands it over). If the class
    has fields the caller did not name (a field added later), it falls back to :func:`construct`.
    """
    if len(fields) != len(cls.__pydantic_fields__) or cls not in _plans or _plans[cls] is None:
        return construct(cls, **fields)
    instance = cls.__new__(cls)
    _set_attr(instance, "__dict__", fields)
    _set_attr(instance, "__pydantic_fields_set__", set(fields))
    _set_attr(instance, "__pydantic_extra__", None)
    _set_attr(instance, "__pydantic_private__", None)
    return instance
