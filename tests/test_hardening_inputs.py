"""Every public entry point refuses a bad argument with a typed error naming it.

Each test here pins one input that used to escape as a raw Python exception (``ValueError``,
``OverflowError``, ``TypeError``, ``UnicodeEncodeError``) or to be accepted and break something
later; now it is a ``DataMachineError`` (or an ``AgentsAPIError`` from the generic loop) that
names the field and the fix, raised before anything runs or is stored.
"""

from __future__ import annotations

from typing import Any

import pytest

from agents_api import IterationBudget
from agents_api.errors import InvalidBudget, brief_repr
from datamachine import InvalidSetting, UsageError
from datamachine.host import Host

USER = [{"role": "user", "content": "go"}]
HUGE = 10**400  # float(HUGE) raises OverflowError


# -- 1. wall-clock durations -----------------------------------------------------------------

@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"),
                                     pytest.param(HUGE, id="400-digit int"),
                                     pytest.param(10**5000, id="5000-digit int"),
                                     0, -1, True, "60"])
def test_payload_max_seconds_that_no_clock_can_count_is_a_usage_error(
        host: Host, seconds: Any) -> None:
    with pytest.raises(UsageError, match=r"payload\['max_seconds'\]"):
        host.run_conversation(USER, payload={"max_seconds": seconds})
    assert host.transcripts.list() == []


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"),
                                     pytest.param(HUGE, id="400-digit int")])
def test_duration_settings_refuse_nan_infinity_and_overflow(host: Host, seconds: Any) -> None:
    for key in ("max_run_seconds", "request_timeout", "connect_timeout"):
        with pytest.raises(InvalidSetting, match=key):
            host.settings.set(key, seconds)
        assert host.settings.get(key) is None


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"),
                                     pytest.param(HUGE, id="400-digit int")])
def test_iteration_budget_refuses_a_time_rail_that_never_fires(seconds: Any) -> None:
    with pytest.raises(InvalidBudget, match="max_seconds"):
        IterationBudget("turns", 3, max_seconds=seconds)


def test_a_huge_value_is_named_by_its_size_not_printed() -> None:
    # repr() of a 5,000-digit integer raises ValueError; the message must still be written.
    assert brief_repr(10**5000) == "an integer of about 5,001 digits"
    assert brief_repr("x" * 500).endswith("...")
    assert len(brief_repr("x" * 500)) == 80
    assert brief_repr(2**63) == "9223372036854775808"


# -- 2. a message's payload ------------------------------------------------------------------

@pytest.mark.parametrize("payload", ["abc", [["a", 1]], 5])
def test_a_message_whose_payload_is_not_a_dict_is_a_usage_error(host: Host, payload: Any) -> None:
    with pytest.raises(UsageError, match=r"messages\[0\]: 'payload' must be a dict"):
        host.run_conversation([{"role": "user", "content": "x", "payload": payload}])
