"""``datamachine spend``: what each spend window holds now (``spend_limits``)."""

from __future__ import annotations

from typing import Any

import click

from agents_api import clock
from datamachine.cli.app import State, handle_errors
from datamachine.cli.output import emit_json, table
from datamachine.conversation.metering import format_usd
from datamachine.conversation.spending import (
    SPEND_LIMITS_KEY,
    parse_spend_limits,
    window_bounds,
)

__all__ = ["spend"]


def _amount(unit: str, value: int) -> str:
    return format_usd(value) if unit == "microdollars" else f"{value:,} tokens"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the windows as JSON.")
@click.pass_obj
@handle_errors
def spend(state: State, as_json: bool) -> None:
    """Use of every spend window now: per limit and scope, settled and reserved, and when it
    resets (UTC calendar windows; the setting spend_limits)."""
    host = state.host
    limits = parse_spend_limits(host.settings.get(SPEND_LIMITS_KEY))
    now = clock.now()
    starts: dict[str, tuple[str, float]] = {
        limit.name: window_bounds(limit.window, now) for limit in limits}
    found = {(use.key.limit, use.key.scope_key): use
             for use in host.spend.windows({name: start for name, (start, _) in starts.items()})}
    rows: list[dict[str, Any]] = []
    for limit in limits:
        start, reset = starts[limit.name]
        keys = sorted(scope_key for name, scope_key in found if name == limit.name)
        if limit.scope == "site" and not keys:
            keys = ["site"]  # the site's window exists, unused
        for scope_key in keys:
            use = found.get((limit.name, scope_key))
            settled = use.settled if use is not None else 0
            reserved = use.reserved if use is not None else 0
            rows.append({
                "limit": limit.name, "budget": limit.budget, "unit": limit.unit,
                "window": limit.window, "scope": limit.scope, "scope_key": scope_key,
                "window_start": start, "settled": settled, "reserved": reserved,
                "used": settled + reserved, "ceiling": limit.ceiling,
                "left": max(0, limit.ceiling - settled - reserved),
                "spent": settled + reserved >= limit.ceiling,
                "resets_in_seconds": max(0, int(reset - now))})
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("No spend limits are set (setting spend_limits; see "
                   "`datamachine docs budgets`).")
        return
    table(["limit", "window", "scope", "used", "of", "left", "reserved", "resets in"],
          [[r["limit"], f"{r['window']} from {r['window_start']}",
            f"{r['scope']}:{r['scope_key']}" if r["scope"] != "site" else "site",
            _amount(r["unit"], r["used"]) + (" (spent)" if r["spent"] else ""),
            _amount(r["unit"], r["ceiling"]), _amount(r["unit"], r["left"]),
            _amount(r["unit"], r["reserved"]), _duration(r["resets_in_seconds"])]
           for r in rows])


def _duration(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    if hours >= 48:
        return f"{hours // 24}d {hours % 24}h"
    return f"{hours}h {rest // 60:02d}m" if hours else f"{rest // 60}m {rest % 60:02d}s"
