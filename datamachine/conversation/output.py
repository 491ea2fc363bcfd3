"""Structured output: a run whose final answer must be a value of a given type.

``output_type=`` (a pydantic model class, or a JSON schema dict) asks for the final answer as
JSON of that shape. An answer that does not parse or validate is not accepted: the model is told
exactly what was wrong and asked again, each retry a turn, as often as the budget
``output_retries`` allows (default 3; 0: never asked again). The accepted value is
``result.output`` (a model instance, or the decoded JSON for a schema). When no valid answer
comes, the run is ``incomplete`` and says why (with the flag ``max_output_retries_reached`` when
the re-asks ran out). Where the endpoint supports it, the schema also goes to the provider as
``response_format`` (the model option; one the caller set wins).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from agents_api import IterationBudget, Message
from agents_api.errors import brief_repr
from agents_api.jsontext import compact_json, unreadable
from datamachine.errors import UsageError

__all__ = ["OUTPUT_RETRY_TYPE", "OutputContract", "check_output_type"]

OUTPUT_RETRY_TYPE = "output_retry"
_FENCE = re.compile(r"^\s*```(?:json|JSON)?\s*\n?(?P<body>.*?)\n?\s*```\s*$", re.DOTALL)
_SHOWN = 2000


def check_output_type(value: Any) -> Any:
    """``value`` if it can be an output type (a pydantic model class or a JSON schema dict),
    else a UsageError naming the fix."""
    if value is None or (isinstance(value, type) and issubclass(value, BaseModel)):
        return value
    if isinstance(value, Mapping):
        from jsonschema import Draft202012Validator, SchemaError

        problem = unreadable(value)
        if problem is not None:  # jsonschema would choke on it writing its own message
            raise UsageError(f"output_type{problem[0]} is not JSON schema data: {problem[1]}.")
        try:
            Draft202012Validator.check_schema(dict(value))
        except SchemaError as exc:
            raise UsageError(f"output_type is not a valid JSON schema: {exc.message}.") from None
        return dict(value)
    raise UsageError(f"output_type must be a pydantic model class or a JSON schema dict, got "
                     f"{brief_repr(value)}.")


class OutputContract:
    """One run's output type: checks each final answer, keeps the accepted value.
    ``retries``: the run's ``output_retries`` budget (None: re-ask without a limit of its
    own)."""

    def __init__(self, output_type: type[BaseModel] | dict[str, Any],
                 retries: IterationBudget | None = None) -> None:
        self.output_type = output_type
        self.retries = retries
        # The answer did not fit and output_retries had no re-ask left.
        self.retries_spent = False
        if isinstance(output_type, dict):
            from jsonschema import Draft202012Validator

            self.schema: dict[str, Any] = output_type
            self.name = str(output_type.get("title") or "output")
            self._schema_validator: Any = Draft202012Validator(output_type)
            self._adapter: TypeAdapter[Any] | None = None
        else:
            self.schema = output_type.model_json_schema()
            self.name = output_type.__name__
            self._schema_validator = None
            self._adapter = TypeAdapter(output_type)
        self.value: Any = None
        self.problem: str | None = None

    def response_format(self) -> dict[str, Any]:
        """The OpenAI ``response_format`` asking for this schema."""
        name = re.sub(r"[^A-Za-z0-9_-]", "_", self.name)[:64] or "output"
        return {"type": "json_schema", "json_schema": {"name": name, "schema": self.schema}}

    def check(self, content: str) -> list[Message]:
        """Accept ``content`` (then nothing more to say) or explain what is wrong: the user
        message asking again."""
        problem = self._problem(content)
        self.problem = problem
        if problem is None:
            return []
        self.value = None
        retries = self.retries
        if retries is not None:
            if retries.current() >= retries.ceiling():
                self.retries_spent = True
                return []
            retries.increment()
        text = (f"Your final answer must be only a JSON value matching this schema:\n"
                f"{compact_json(self.schema)[:_SHOWN]}\nIt was not accepted: {problem}. "
                "Answer again with only the corrected JSON.")
        return [Message.text("user", text, {"type": OUTPUT_RETRY_TYPE})]

    def _problem(self, content: str) -> str | None:
        text = content.strip()
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group("body").strip()
        try:
            decoded = json.loads(text)
        except json.JSONDecodeError as exc:
            shown = text if len(text) <= 80 else text[:77] + "..."
            return f"it is not JSON ({exc.msg} at character {exc.pos + 1}; you wrote {shown!r})"
        if self._adapter is not None:
            try:
                self.value = self._adapter.validate_python(decoded)
            except ValidationError as exc:
                return "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'the value'}: {e['msg']}"
                    for e in exc.errors())
            return None
        errors = sorted(self._schema_validator.iter_errors(decoded), key=lambda e: list(e.path))
        if errors:
            return "; ".join(
                f"{'.'.join(str(p) for p in e.path) or 'the value'}: {e.message}"
                for e in errors)
        self.value = decoded
        return None
