"""SettingSpec and SettingDeclarations: types, text from a person, masking, declarations."""

from __future__ import annotations

import re
from typing import Any

import pytest

from datamachine import SettingSpec
from datamachine.errors import InvalidBudgetValue, InvalidSetting, InvalidSettingSpec
from datamachine.registry import BudgetSpec, IterationBudgetRegistry
from datamachine.setting_spec import SettingDeclarations


def _confirm(key: str, value: Any) -> None:
    if value not in ("ask", "pause"):
        raise ValueError(f"must be 'ask' or 'pause', got {value!r}")


@pytest.mark.parametrize(("types", "raw", "parsed"), [
    ("integer", "40", 40),
    ("integer", "forty", "forty"),  # the check then refuses it, naming the type
    ("number", "1.5", 1.5),
    ("number", "2", 2),
    ("string", "1234", "1234"),
    ("string", "gpt-4o", "gpt-4o"),
    ("string", '"my site"', "my site"),
    ("string", "null", "null"),
    ("boolean", "true", True),
    ("boolean", "False", False),
    ("boolean", "yes", "yes"),
    (("integer", "string"), "unlimited", "unlimited"),
    (("integer", "string"), "30", 30),
    (("boolean", "array"), '["10.0.0.0/8"]', ["10.0.0.0/8"]),
    ("object", '{"a": 1}', {"a": 1}),
    ("any", "plain words", "plain words"),
    ("any", "7", 7),
])
def test_parse_text_reads_a_person_s_text_by_the_declared_type(types: Any, raw: str,
                                                                 parsed: Any) -> None:
    assert SettingSpec(name="k", type=types).parse_text(raw) == parsed


@pytest.mark.parametrize(("types", "value", "message"), [
    ("integer", "40", "'k' must be an integer, got '40' (string)"),
    ("integer", True, "must be an integer, got True (boolean)"),
    ("number", float("nan"), "'k' must be a finite number, got nan"),
    ("number", float("inf"), "must be a finite number"),
    ("string", None, "must be a string, got None (null)"),
    (("array", "null"), "a", "must be an array or null"),
    ("object", object(), "(object)"),
])
def test_check_refuses_a_value_of_the_wrong_type_saying_what_fits(types: Any, value: Any,
                                                                  message: str) -> None:
    with pytest.raises(InvalidSetting, match=re.escape(message)):
        SettingSpec(name="k", type=types).check(value)


def test_a_number_setting_takes_integers_and_a_huge_one_is_no_overflow() -> None:
    spec = SettingSpec(name="k", type="number")
    spec.check(3)
    spec.check(10**400)  # no OverflowError: only floats are checked for NaN and infinities


def test_the_validator_s_message_wins_over_the_type_error() -> None:
    spec = SettingSpec(name="confirmation", type="string", validator=_confirm)
    with pytest.raises(InvalidSetting, match="Setting 'confirmation': must be 'ask' or 'pause'"):
        spec.check("later")
    with pytest.raises(InvalidSetting, match="must be 'ask' or 'pause', got 3"):
        spec.check(3)


def test_a_validator_surprised_by_the_type_leaves_the_type_error() -> None:
    def positive(key: str, value: Any) -> None:
        if value <= 0:  # a TypeError for a string
            raise ValueError("must be positive")

    spec = SettingSpec(name="k", type="integer", validator=positive)
    with pytest.raises(InvalidSetting, match="must be an integer"):
        spec.check("x")
    with pytest.raises(InvalidSetting, match="Setting 'k': must be positive"):
        spec.check(0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"name": "Max"}, "name 'Max' must be lowercase"),
    ({"name": "x_mine"}, "free-form"),
    ({"name": "k", "type": "float"}, "invalid type"),
    ({"name": "k", "type": ()}, "at least one type"),
    ({"name": "k", "secret": "yes"}, "invalid secret"),
    ({"name": "k", "surprise": 1}, "invalid surprise"),
])
def test_a_malformed_declaration_is_refused_naming_the_field(fields: dict[str, Any],
                                                             message: str) -> None:
    with pytest.raises(InvalidSettingSpec, match=message):
        SettingSpec(**fields)


def test_masked_hides_secrets_and_keeps_the_rest() -> None:
    whole = SettingSpec(name="k", type="string", secret=True)
    assert whole.masked("sk-0123456789abcdef") == "****cdef"
    assert whole.masked("short") == "****"
    assert whole.masked(None) is None
    sites = SettingSpec(name="sites", type="object", secret_fields=("token", "headers"))
    value: dict[str, Any] = {"b": {"url": "http://b", "token": "dm_0123456789abcdefXYZW"},
             "c": [{"headers": {"Authorization": "Bearer x"}}]}
    assert sites.masked(value) == {"b": {"url": "http://b", "token": "****XYZW"},
                                   "c": [{"headers": {"Authorization": "****"}}]}
    assert value["b"]["token"] == "dm_0123456789abcdefXYZW"  # not changed in place
    assert sorted(sites.secrets_in(value)) == ["Bearer x", "dm_0123456789abcdefXYZW"]
    assert SettingSpec(name="k").masked("visible") == "visible"



def test_a_value_whose_secret_fields_cannot_be_found_is_masked_whole() -> None:
    sites = SettingSpec(name="sites", type="object", secret_fields=("token",))
    text = '{"a": {"token": "dm_0123456789abcdefXYZW"},}'  # not JSON: kept as text
    assert sites.masked(text) == "****"
    assert sites.secrets_in(text) == [text]
    assert sites.masked([{"url": "http://a", "token": "t"}]) == [{"url": "****", "token": "****"}]
    assert sites.masked({"a": {"url": "http://a"}}, whole=True) == {"a": {"url": "****"}}
    key = SettingSpec(name="key", type="object", secret=True)
    assert key.masked('{"k": "sk-0123456789abcdef"') == "****"  # no tail of text
    assert key.masked({"k": "sk-0123456789abcdef"}) == {"k": "****cdef"}
    with pytest.raises(InvalidSetting) as refused:
        sites.check(text)
    assert "XYZW" not in str(refused.value)
    assert "got a string (not shown: it may hold a secret)" in str(refused.value)

def test_declarations_check_the_default_and_name_their_owner() -> None:
    declarations = SettingDeclarations()
    with pytest.raises(InvalidSettingSpec, match=r"'confirmation' \(by 'me'\): its default"):
        declarations.declare(SettingSpec(name="confirmation", type="string", default="later",
                                         validator=_confirm), owner="me")
    declarations.declare(SettingSpec(name="confirmation", default="ask", validator=_confirm),
                         owner="me")
    assert declarations.owner("confirmation") == "me"
    assert declarations.names() == ["confirmation"]


def test_a_budget_s_setting_is_declared_by_the_budget() -> None:
    budgets = IterationBudgetRegistry()
    declarations = SettingDeclarations(budgets)
    assert declarations.get("max_uploads") is None
    budgets.register(BudgetSpec(name="uploads", default=4, max=9, setting="max_uploads"),
                     owner="uploader")
    budgets.register(BudgetSpec(name="cost", default=None, max=10**12,
                                setting="max_cost_usd", unit="microdollars"))
    spec = declarations.get("max_uploads")
    assert spec is not None
    assert (spec.type, spec.default, declarations.owner("max_uploads")) == ("integer", 4,
                                                                           "uploader")
    assert "clamped to [1, 9]" in spec.description
    assert declarations.get("max_uploads") is spec  # made once per registration
    with pytest.raises(InvalidBudgetValue, match="setting 'max_uploads'"):
        spec.check("many")
    dollars = declarations.get("max_cost_usd")
    assert dollars is not None
    assert (dollars.type, dollars.default) == ("number", None)
    dollars.check(0.25)
    assert declarations.owner("max_cost_usd") == "core"  # no owner given: the core's
    assert declarations.names() == ["max_cost_usd", "max_uploads"]


@pytest.mark.parametrize("mask", ["****", "****WXYZ"])
def test_a_masked_secret_is_refused_naming_reveal(mask: str) -> None:
    sites = SettingSpec(name="sites", type="object", secret_fields=("token",))
    with pytest.raises(InvalidSetting, match=r"settings get sites --reveal"):
        sites.check({"a": {"url": "http://a", "token": mask}})
    sites.check({"a": {"url": "****", "token": "dm_****WXYZ"}})  # only masks in secret fields
    with pytest.raises(InvalidSetting, match="a secret as listings mask it"):
        SettingSpec(name="key", type="string", secret=True).check(mask)


@pytest.mark.parametrize("error", [OverflowError("int too large to convert to float"),
                                   TypeError("'<' not supported"), RecursionError()])
def test_a_check_surprised_by_the_value_refuses_it_as_an_invalid_setting(
        error: Exception) -> None:
    def surprised(key: str, value: Any) -> None:
        raise error

    with pytest.raises(InvalidSetting, match=r"'limit' cannot take this value: its check failed "
                                             rf"\({type(error).__name__}"):
        SettingSpec(name="limit", type="number", validator=surprised).check(10**400)
