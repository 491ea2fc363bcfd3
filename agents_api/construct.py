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

__all__ = ["assign", "construct", "construct_all"]

M = TypeVar("M", bound=BaseModel)

_IMMUTABLE = (type(None), str, int, float, bool, bytes)
_MISSING: Any = object()
_set_attr = object.__setattr__


def _slot_setter(name: str) -> Callable[[Any, Any], None]:
    """The setter of one of BaseModel's instance slots, looked up once.

    ``object.__setattr__(instance, name, value)`` finds the same descriptor on every call;
    calling its ``__set__`` directly is several times cheaper, and an instance is four of them.
    """
    for klass in BaseModel.__mro__:
        descriptor = klass.__dict__.get(name)
        if descriptor is not None and hasattr(descriptor, "__set__"):
            return descriptor.__set__  # type: ignore[no-any-return]
    return lambda instance, value: _set_attr(instance, name, value)


_set_dict = _slot_setter("__dict__")
_set_fields_set = _slot_setter("__pydantic_fields_set__")
_set_extra = _slot_setter("__pydantic_extra__")
_set_private = _slot_setter("__pydantic_private__")


def _copier(default: Any) -> Callable[[], Any]:
    # pydantic deep-copies a mutable default for every instance; so do we.
    return lambda: copy.deepcopy(default)


class _Plan:
    """How to build one class: a template of every field in declaration order, holding the
    immutable defaults, and a maker for each field whose default must be fresh per instance."""

    __slots__ = ("extra", "fill", "names", "new", "required", "size", "template")

    def __init__(self, cls: type[BaseModel]) -> None:
        # object.__new__ called directly skips looking it up through the class on every call.
        self.new: Callable[[type[Any]], Any] = (
            object.__new__ if cls.__new__ is object.__new__ else cls.__new__)
        # extra="allow" models keep extra values in a dict (empty when none are given).
        self.extra = cls.model_config.get("extra") == "allow"
        self.template: dict[str, Any] = {}
        self.fill: list[tuple[str, Callable[[], Any]]] = []
        self.required: list[str] = []
        for name, field in cls.__pydantic_fields__.items():
            self.template[name] = _MISSING
            factory = field.default_factory
            if field.is_required():
                self.required.append(name)
            elif factory is not None:
                self.fill.append((name, factory))  # type: ignore[arg-type]
            elif isinstance(field.default, _IMMUTABLE):
                self.template[name] = field.default
            else:
                self.fill.append((name, _copier(field.default)))
        self.size = len(self.template)
        # Copying a ready set is about half the cost of building one from a dict's keys.
        self.names = set(self.template)


def _plan(cls: type[BaseModel]) -> _Plan | None:
    if cls.__pydantic_post_init__ or cls.__pydantic_root_model__ or cls.__private_attributes__:
        return None  # rare shapes: let pydantic do it
    for field in cls.__pydantic_fields__.values():
        if field.default_factory is not None and field.default_factory_takes_validated_data:
            return None  # a factory that reads other fields: let pydantic do it
    return _Plan(cls)


_plans: dict[type[BaseModel], _Plan | None] = {}


def construct(cls: type[M], /, **values: Any) -> M:
    """``cls.model_construct(**values)`` for values given by field name (not by alias)."""
    try:
        plan = _plans[cls]
    except KeyError:
        plan = _plans[cls] = _plan(cls)
    if plan is None:
        return cls.model_construct(**values)
    # Given values replace template entries in place, so declaration order is kept.
    fields = {**plan.template, **values}
    if len(fields) != plan.size:
        if plan.extra:
            return cls.model_construct(**values)  # names that are not fields become extras
        # A name that is not a field: model_construct ignores it; so do we, the slow way.
        return construct(cls, **{k: v for k, v in values.items() if k in plan.template})
    for name, make in plan.fill:
        if fields[name] is _MISSING:
            fields[name] = make()
    for name in plan.required:
        if fields[name] is _MISSING:
            del fields[name]
    instance: M = plan.new(cls)
    _set_dict(instance, fields)
    _set_fields_set(instance, set(values))
    _set_extra(instance, {} if plan.extra else None)
    _set_private(instance, None)
    return instance


def construct_all(cls: type[M], fields: dict[str, Any], /) -> M:
    """Like :func:`construct` when ``fields`` names every field, in declaration order.

    The dict becomes the instance's ``__dict__`` as is (the caller hands it over). If the class
    has fields the caller did not name (a field added later), it falls back to :func:`construct`.
    """
    plan = _plans.get(cls)
    if plan is None or len(fields) != plan.size:
        return construct(cls, **fields)
    instance: M = plan.new(cls)
    _set_dict(instance, fields)
    _set_fields_set(instance, plan.names.copy())
    _set_extra(instance, {} if plan.extra else None)
    _set_private(instance, None)
    return instance


def assign(instance: BaseModel, /, **values: Any) -> None:
    """Set fields of a model built by :func:`construct`, as plain attribute assignment would.

    ``BaseModel.__setattr__`` looks up a handler per call; settling a run's verdict writes a
    dozen fields, so this writes the instance dict and the set of fields directly. Only for
    models without ``validate_assignment``, and for names that are fields (checked).
    """
    cls = type(instance)
    if cls.model_config.get("validate_assignment") or cls.model_config.get("frozen"):
        for name, value in values.items():
            setattr(instance, name, value)  # let pydantic validate (or refuse) it
        return
    fields = cls.__pydantic_fields__
    for name in values:
        if name not in fields:  # the error pydantic's own assignment raises
            raise ValueError(f'"{cls.__name__}" object has no field "{name}"')
    instance.__dict__.update(values)
    instance.__pydantic_fields_set__.update(values)
