"""Caller context for agent-to-agent calls: parsing the headers, and admitting or refusing a hop.

Agents on different hosts call each other's ``/chat``; without a bound, A→B→C→A recurses
forever. Each hop carries the chain in headers (names below). The receiver computes the depth
this hop would land at (inbound header + 1; an absent header counts as 0) and creates the
``chain_depth`` budget with that as its current value, so the budget describes the chain *after*
the hop lands: with the default ceiling 3 a call with no header lands at 1 (accepted), header 1
at 2 (accepted), header 2 at 3 (refused, HTTP 429). The chain also lists the sites it passed
through, so a call that would return to a site already on it is refused as a cycle (HTTP 409)
however shallow it is.

Nothing here imports the web stack: the outbound ``call_remote_agent`` tool builds its headers
with :meth:`CallerContext.outbound_headers`, and a run learns its place in the chain from the
payload key ``caller_context`` (:meth:`CallerContext.from_payload`).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from datamachine.budgets_builtin import CHAIN_DEPTH
from datamachine.errors import ChainCycle, ChainDepthExceeded, InvalidCallerContext, UsageError
from datamachine.server.site import SITE_ID_PATTERN

if TYPE_CHECKING:
    from datamachine.host import Host

__all__ = [
    "CALLER_HEADERS",
    "CHAIN_DEPTH_BUDGET",
    "HEADER_CALLER_AGENT",
    "HEADER_CALLER_SITE",
    "HEADER_CHAIN_DEPTH",
    "HEADER_CHAIN_ID",
    "HEADER_CHAIN_SITES",
    "MAX_CHAIN_SITES",
    "MAX_HEADER_DEPTH",
    "PAYLOAD_KEY",
    "RETRY_AFTER_SECONDS",
    "CallerContext",
    "InboundChain",
    "admit",
    "parse_caller_headers",
]

logger = logging.getLogger("datamachine.server")

HEADER_CHAIN_ID = "X-Datamachine-Chain-Id"
HEADER_CHAIN_DEPTH = "X-Datamachine-Chain-Depth"
HEADER_CALLER_SITE = "X-Datamachine-Caller-Site"
HEADER_CALLER_AGENT = "X-Datamachine-Caller-Agent"
HEADER_CHAIN_SITES = "X-Datamachine-Chain-Sites"
CALLER_HEADERS = (HEADER_CHAIN_ID, HEADER_CHAIN_DEPTH, HEADER_CALLER_SITE, HEADER_CALLER_AGENT,
                  HEADER_CHAIN_SITES)

CHAIN_DEPTH_BUDGET = CHAIN_DEPTH
PAYLOAD_KEY = "caller_context"
# Far above any ceiling the budget allows (its clamp stops at 10): a larger number is not a deep
# chain but a broken or hostile caller, and is refused as malformed rather than as "too deep".
MAX_HEADER_DEPTH = 1000
MAX_CHAIN_SITES = 100
# The source answers 60; a deeper chain will not fit later either, but the header tells well
# behaved clients not to hammer the site.
RETRY_AFTER_SECONDS = 60

_CHAIN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_AGENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")
_DEPTH_RE = re.compile(r"^[0-9]{1,9}$")


class InboundChain(BaseModel):
    """The caller context one request brought, as parsed from its headers.

    ``depth`` is the inbound header (0 when absent); ``chain_id_generated`` is True when the
    request named no chain, so this hop starts one.
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    chain_id: str
    chain_id_generated: bool = False
    depth: int = 0
    caller_site: str | None = None
    caller_agent: str | None = None
    chain_sites: tuple[str, ...] = ()

    @property
    def landing_depth(self) -> int:
        """The depth this hop lands at if admitted: inbound + 1."""
        return self.depth + 1


class CallerContext(BaseModel):
    """Where a run sits in an agent-to-agent chain; travels in the payload as ``caller_context``.

    ``chain_depth`` is the depth the current request landed at (0 for a run nobody called over
    HTTP); ``chain_sites`` are the sites the chain passed through before this one (the caller
    included). The outbound tool sends ``chain_depth`` as the next hop's inbound depth and adds
    this site to ``chain_sites``.
    """

    model_config = ConfigDict(defer_build=True, frozen=True, extra="forbid")

    chain_id: str = Field(pattern=_CHAIN_ID_RE.pattern)
    chain_depth: int = Field(default=0, ge=0, le=MAX_HEADER_DEPTH)
    chain_sites: tuple[str, ...] = Field(default=(), max_length=MAX_CHAIN_SITES)
    caller_site: str | None = None
    caller_agent: str | None = None

    @classmethod
    def top_level(cls) -> CallerContext:
        """A run at the top of a new chain (depth 0, fresh chain id)."""
        return cls(chain_id=uuid.uuid4().hex)

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> CallerContext:
        """The context in ``payload["caller_context"]``, or a top-level one when there is none.

        A value that is present but malformed raises :class:`UsageError`: guessing a depth
        would either break the chain bound or refuse a legitimate call.
        """
        raw = payload.get(PAYLOAD_KEY)
        if raw is None:
            return cls.top_level()
        if isinstance(raw, CallerContext):
            return raw
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                                 for e in exc.errors())
            raise UsageError(
                f"payload[{PAYLOAD_KEY!r}] must be {{'chain_id', 'chain_depth', 'chain_sites'}} "
                f"as the /chat server sets it: {problems}."
            ) from None

    def to_payload(self) -> dict[str, Any]:
        """The JSON form stored under ``payload["caller_context"]``."""
        return self.model_dump(mode="json")

    def outbound_headers(self, site_id: str, agent: str | None = None) -> dict[str, str]:
        """Headers for a call from this run (on site ``site_id``) to another site's ``/chat``.

        The depth sent is this run's own landing depth; the receiver adds one. The chain id is
        kept, and this site joins the list of sites passed through.
        """
        sites = _dedupe([*self.chain_sites, site_id])
        headers = {
            HEADER_CHAIN_ID: self.chain_id,
            HEADER_CHAIN_DEPTH: str(self.chain_depth),
            HEADER_CALLER_SITE: site_id,
            HEADER_CHAIN_SITES: ",".join(sites),
        }
        if agent and _AGENT_RE.fullmatch(agent):
            headers[HEADER_CALLER_AGENT] = agent
        return headers


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _single(values: dict[str, list[str]], header: str) -> str | None:
    found = values.get(header.lower())
    if not found:
        return None
    if len(found) > 1:
        # Two values for one header could be read differently by a proxy and by us; refuse.
        raise InvalidCallerContext(f"{header} was sent {len(found)} times; send it once.",
                                   header=header)
    return found[0].strip()


def _parse_depth(raw: str | None) -> int:
    if raw is None:
        return 0
    if not _DEPTH_RE.fullmatch(raw):
        raise InvalidCallerContext(
            f"{HEADER_CHAIN_DEPTH} must be a non-negative integer (the caller's own depth), "
            f"got {raw[:40]!r}.", header=HEADER_CHAIN_DEPTH)
    depth = int(raw)
    if depth > MAX_HEADER_DEPTH:
        raise InvalidCallerContext(
            f"{HEADER_CHAIN_DEPTH} must be at most {MAX_HEADER_DEPTH}, got {depth}.",
            header=HEADER_CHAIN_DEPTH)
    return depth


def _parse_token(raw: str | None, header: str, pattern: re.Pattern[str], limit: int
                 ) -> str | None:
    if raw is None:
        return None
    if not pattern.fullmatch(raw):
        raise InvalidCallerContext(
            f"{header} must be 1-{limit} letters, digits or '.', '_', ':', '-' (starting with a "
            f"letter or digit), got {raw[:40]!r}.", header=header)
    return raw


def _parse_sites(raw: str | None) -> tuple[str, ...]:
    if raw is None or raw == "":
        return ()
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) > MAX_CHAIN_SITES:
        raise InvalidCallerContext(
            f"{HEADER_CHAIN_SITES} lists {len(parts)} sites; at most {MAX_CHAIN_SITES} are "
            "accepted.", header=HEADER_CHAIN_SITES)
    for part in parts:
        if not SITE_ID_PATTERN.fullmatch(part):
            raise InvalidCallerContext(
                f"{HEADER_CHAIN_SITES} must be comma-separated site ids (1-64 letters, digits, "
                f"'.', '_', ':' or '-'), got the entry {part[:40]!r}.", header=HEADER_CHAIN_SITES)
    return tuple(_dedupe(parts))


def parse_caller_headers(items: Iterable[tuple[str, str]]) -> InboundChain:
    """Parse the caller-context headers of one request (every ``(name, value)`` pair).

    Raises :class:`InvalidCallerContext` naming the header for a non-integer, negative or
    absurdly large depth, a chain id or site id with bad characters or length, or a header sent
    twice. An absent chain id starts a new chain (a uuid4 hex).
    """
    values: dict[str, list[str]] = {}
    wanted = {h.lower() for h in CALLER_HEADERS}
    for name, value in items:
        key = name.lower()
        if key in wanted:
            values.setdefault(key, []).append(value)
    depth = _parse_depth(_single(values, HEADER_CHAIN_DEPTH))
    chain_id = _parse_token(_single(values, HEADER_CHAIN_ID), HEADER_CHAIN_ID, _CHAIN_ID_RE, 128)
    caller_site = _parse_token(_single(values, HEADER_CALLER_SITE), HEADER_CALLER_SITE,
                               SITE_ID_PATTERN, 64)
    caller_agent = _parse_token(_single(values, HEADER_CALLER_AGENT), HEADER_CALLER_AGENT,
                                _AGENT_RE, 128)
    sites = _parse_sites(_single(values, HEADER_CHAIN_SITES))
    return InboundChain(
        chain_id=chain_id or uuid.uuid4().hex,
        chain_id_generated=chain_id is None,
        depth=depth,
        caller_site=caller_site,
        caller_agent=caller_agent,
        chain_sites=sites,
    )


def admit(host: Host, inbound: InboundChain, site_id: str) -> CallerContext:
    """Admit the hop onto this site, or refuse it before any work.

    A cycle is checked first (it would never succeed, so "retry later" would be a lie), then the
    depth: the ``chain_depth`` budget is created with ``current`` = the landing depth, and an
    exceeded budget (``current >= ceiling``) refuses the hop. The ceiling is read per request,
    so raising the setting ``max_chain_depth`` takes effect at once.

    Raises :class:`ChainCycle` or :class:`ChainDepthExceeded`; returns the context the run gets.
    """
    passed = _dedupe([*inbound.chain_sites,
                      *([inbound.caller_site] if inbound.caller_site else [])])
    if site_id in passed:
        logger.warning("datamachine: refused chain %s: cycle back to site %s (sites %s)",
                       inbound.chain_id, site_id, ",".join(passed))
        raise ChainCycle(
            f"Agent chain {inbound.chain_id} already passed through this site ({site_id}); "
            "refusing the call to break the cycle. Answer from what you have instead.",
            chain_id=inbound.chain_id, site_id=site_id, chain_sites=passed)
    landing = inbound.landing_depth
    with host.settings.batch():  # the budget's settings, read as one snapshot
        budget = host.budgets.create(CHAIN_DEPTH_BUDGET, current=landing)
    if budget.exceeded():
        logger.warning("datamachine: refused chain %s at depth %d (ceiling %d)",
                       inbound.chain_id, landing, budget.ceiling())
        raise ChainDepthExceeded(
            f"A2A chain depth ({budget.ceiling()}) exceeded: this call would land at depth "
            f"{landing}. Refusing to extend the chain further.",
            chain_id=inbound.chain_id, chain_depth=landing, ceiling=budget.ceiling(),
            retry_after=RETRY_AFTER_SECONDS)
    return CallerContext(chain_id=inbound.chain_id, chain_depth=landing,
                         chain_sites=tuple(passed), caller_site=inbound.caller_site,
                         caller_agent=inbound.caller_agent)
