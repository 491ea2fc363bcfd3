"""What a ``/chat`` caller may reach (DESIGN.md 20): its claims, and its tools.

A bearer token is the caller's only proof of identity. The caller-context headers are claims:
``X-Datamachine-Caller-Site`` and ``X-Datamachine-Caller-Agent`` say who is calling, and only a
token created for another site (``datamachine tokens create NAME --site SITE_ID``) may make
them, for that site alone. The chain headers (id, depth, sites passed) are taken as sent: a
forged list of sites can only refuse more calls as cycles, never reach more.

Tools: a token created with ``--tools a,b`` reaches those; any other token reaches the setting
``chat_tools`` (a list of names; unset: every registered tool). No header or body field widens
either list.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from datamachine.server.chain import HEADER_CALLER_AGENT, HEADER_CALLER_SITE, InboundChain
from datamachine.server.errors import Problem

if TYPE_CHECKING:
    from datamachine.host import Host
    from datamachine.storage.tokens import ApiToken
    from datamachine.tools import Tool

__all__ = ["CHAT_TOOLS_SETTING", "CLAIM_REFUSED_CODE", "check_claims", "reachable_tools"]

logger = logging.getLogger("datamachine.server")

CHAT_TOOLS_SETTING = "chat_tools"
CLAIM_REFUSED_CODE = "caller_not_allowed"


def check_claims(token: ApiToken, inbound: InboundChain) -> InboundChain:
    """``inbound`` with its caller site set from the token; a 403 :class:`Problem` when a
    header claims more than the token may (any caller header from a token made for no site,
    another site than the token's)."""
    if token.site is None:
        claimed = [header for header, value in ((HEADER_CALLER_SITE, inbound.caller_site),
                                                (HEADER_CALLER_AGENT, inbound.caller_agent))
                   if value is not None]
        if claimed:
            raise Problem(
                403, CLAIM_REFUSED_CODE,
                f"This token is not a site's token, so it may not send {claimed[0]}. Leave the "
                "header out, or ask this site's operator for a token made for your site "
                "(`datamachine tokens create NAME --site YOUR_SITE_ID`).",
                {"header": claimed[0]})
        return inbound
    if inbound.caller_site is not None and inbound.caller_site != token.site:
        raise Problem(
            403, CLAIM_REFUSED_CODE,
            f"{HEADER_CALLER_SITE} must be the site this token was made for; this token may "
            "not claim another site.", {"header": HEADER_CALLER_SITE})
    return inbound.model_copy(update={"caller_site": token.site})


def reachable_tools(host: Host, token: ApiToken) -> dict[str, Tool]:
    """The tools a run for ``token`` is offered: its allowlist, else the setting
    ``chat_tools``, else every registered tool; names no plugin registers are skipped."""
    registered = host.tools.tools()
    names = token.tools if token.tools is not None else host.settings.get(CHAT_TOOLS_SETTING)
    if names is None:
        return registered
    missing = [name for name in names if name not in registered]
    if missing:
        logger.warning("datamachine: token %r allows tools this site does not have: %s",
                       token.name, ", ".join(missing))
    return {name: registered[name] for name in names if name in registered}
