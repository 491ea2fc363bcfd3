"""datamachine-fetch: an HTTP fetch tool for agents, bounded by its own budget and kept to
public addresses.

Agents that browse tend to fetch page after page. This plugin offers the ``fetch_url`` tool and
owns the ``http_fetches`` budget (default 10 per run, clamp [1, 100], setting
``max_http_fetches``) so a host can bound fetching separately from turns and tool calls.

Each ``fetch_url`` call consumes one unit of the run's ``http_fetches`` budget *before* it
touches the network, and refuses to fetch once the budget is spent. The loop checks every budget
after each tool call, so the fetch that reaches the ceiling is the last one: the run stops with
``status="budget_exceeded"`` and ``budget="http_fetches"``. A URL refused before any connection
(not http(s), an address that is not allowed, a name that does not resolve, an invalid
``fetch_allow_private``) uses no budget.

The address guard (DESIGN.md section 20): the model picks the URL, so without a guard it could
reach what the server reaches (the cloud metadata service, loopback admin ports, the intranet).
Every hop, the first request and each redirect (followed here, at most ``MAX_REDIRECTS``), has
its host resolved, *every* address checked (:mod:`datamachine_fetch._addresses`), and the request
sent to the exact address that was checked: the URL's host is replaced by that address, the
``Host`` header keeps the name, and the request extension ``sni_hostname`` makes TLS send and
verify the name. A name cannot resolve to a public address for the check and to a private one
for the connection (DNS rebinding). The site setting ``fetch_allow_private`` (``false``,
``true`` or a list of networks) lifts the guard.

Because requests go to pinned addresses, the client keeps no connections between requests and
no cookies (either could otherwise be reused for another name on the same address), and it
ignores environment proxies (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``): through a proxy the
proxy would resolve the name, and the check would mean nothing. ``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` still apply.

The tool answers with the HTTP status, the content type, the final URL (after redirects) and at
most the first ``MAX_BYTES`` of the body as text, so one large page cannot flood the model's
context. A 4xx/5xx answer is a failed tool result (the model may try another URL); it still
counts as a fetch.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from datamachine import BudgetSpec, SettingSpec, hookimpl
from datamachine.errors import InvalidSetting
from datamachine.tools import Tool, ToolContext, tool
from datamachine_fetch._addresses import (
    ALLOW_PRIVATE_SETTING,
    AllowPrivate,
    IPAddress,
    address_class,
    describe_class,
    parse_allow_private,
    resolve,
)

if TYPE_CHECKING:
    from http.cookiejar import CookieJar

    import httpx

__all__ = ["ALLOW_PRIVATE_SETTING", "HTTP_FETCHES", "MAX_BYTES", "MAX_REDIRECTS",
           "TIMEOUT_SECONDS", "AllowPrivate", "address_class", "fetch_url",
           "parse_allow_private", "register_budgets", "register_settings", "register_tools",
           "resolve"]

HTTP_FETCHES = BudgetSpec(
    name="http_fetches",
    default=10,
    min=1,
    max=100,
    setting="max_http_fetches",
    description="HTTP fetches by the fetch_url tool in one run.",
)

# The most body text a model receives from one fetch (64 KiB).
MAX_BYTES = 64 * 1024
# Seconds for connecting and for each read; a slow server fails the call, not the run.
TIMEOUT_SECONDS = 15.0
# Redirects followed by one fetch; each is resolved and checked like the first request.
MAX_REDIRECTS = 5
_USER_AGENT = "datamachine-fetch/0.1 (+https://pypi.org/project/datamachine-fetch/)"


class _Failed(Exception):
    """A fetch that ends in a failed tool result; ``result`` is what the model reads."""

    def __init__(self, error_type: str, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.result: dict[str, Any] = {"success": False, "error_type": error_type,
                                       "error": error, **extra}


@dataclass(frozen=True)
class _Hop:
    """One request to make: the URL as the model sees it, the checked addresses of its host
    (in the order to try them) and the host name TLS must check (None for an address)."""

    url: httpx.URL
    addresses: tuple[IPAddress, ...]
    name: str | None


@dataclass(frozen=True)
class _Page:
    """A final (non-redirect) answer, as read from the wire."""

    url: str
    status: int
    reason: str
    content_type: str
    text: str
    truncated: bool

    def result(self) -> dict[str, Any]:
        page = {"url": self.url, "status": self.status, "content_type": self.content_type,
                "text": self.text, "truncated": self.truncated}
        if self.status >= 400:
            return {"success": False, "error_type": "http_error", **page,
                    "error": f"GET {self.url} answered HTTP {self.status} {self.reason}."}
        return {"success": True, "result": page}


@tool(name="fetch_url")
def fetch_url(url: str, context: ToolContext) -> dict[str, Any]:
    """Fetch a web page or API response over HTTP(S) with a GET request.

    Returns the HTTP status, the content type, the final URL and the start of the body as text.
    Each call uses one unit of this run's http_fetches budget, so fetch only what you need.

    Args:
        url: The absolute http:// or https:// URL to fetch.
    """
    try:
        return _fetch(url.strip(), context)
    except _Failed as failed:
        return failed.result


def _fetch(url: str, context: ToolContext) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _Failed("invalid_url",
                      f"fetch_url needs an absolute http:// or https:// URL, got {url!r}.")
    policy = _policy(context)
    budget = context.budget(HTTP_FETCHES.name)
    if budget.exceeded():
        raise _Failed("budget_exceeded",
                      f"The http_fetches budget for this run is spent ({budget.current()} of "
                      f"{budget.ceiling()}); answer with what you have already fetched.")
    hop = _checked(_parse(url), policy)
    # Counted before the request: a fetch that times out still cost the server and the clock.
    # A refused address never reached the network, so it is not counted.
    budget.increment()
    return _follow(hop, policy)


def _policy(context: ToolContext) -> AllowPrivate:
    """The run's ``fetch_allow_private``; a run outside a host gets the safe default."""
    host = context.host
    if host is None:
        return AllowPrivate()
    try:
        return parse_allow_private(host.settings.get(ALLOW_PRIVATE_SETTING, False))
    except InvalidSetting as exc:
        # Fail closed: an unreadable setting must not fall back to either extreme silently.
        raise _Failed("invalid_setting", f"fetch_url is off until the site fixes a setting. "
                                         f"{exc}") from None


def _parse(url: str) -> httpx.URL:
    import httpx  # imported on first fetch, so booting a host stays cheap

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _Failed("invalid_url", f"fetch_url cannot read the URL {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise _Failed("invalid_url",
                      f"fetch_url needs an absolute http:// or https:// URL, got {url!r}.")
    return parsed


def _checked(url: httpx.URL, policy: AllowPrivate) -> _Hop:
    """Resolve ``url``'s host and check every address; refuse the hop if any is refused."""
    host = url.host
    name: str | None = None
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:
        name = url.raw_host.decode("ascii")  # IDNA-encoded, as DNS and TLS want it
        try:
            # Looked up on the module at each call, so tests can stand in for DNS.
            addresses = resolve(name, _port(url))
        except OSError as exc:
            raise _Failed("fetch_failed", f"Fetching {url} failed: the host {host!r} does not "
                                          f"resolve ({exc}).") from None
    for address in addresses:
        refused = policy.refuses(address)
        if refused is not None:
            where = f"{host} resolves to {address}," if name else f"{address} is"
            raise _Failed(
                "address_not_allowed",
                f"fetch_url refused {url}: {where} a {describe_class(refused)} address. This "
                "site does not allow fetching loopback, private, link-local or metadata "
                f"addresses; the site setting {ALLOW_PRIVATE_SETTING!r} can allow them (true, "
                "or a list of networks).",
                url=str(url), host=host, address=str(address), address_class=refused)
    if not addresses:
        raise _Failed("fetch_failed", f"Fetching {url} failed: {host!r} has no address.")
    return _Hop(url, tuple(addresses), name)


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _follow(hop: _Hop, policy: AllowPrivate) -> dict[str, Any]:
    """Send ``hop`` and each redirect after it (checked again), up to ``MAX_REDIRECTS``."""
    first, redirects = hop.url, 0
    while True:
        answer = _send(hop)
        if isinstance(answer, _Page):
            return answer.result()
        if redirects == MAX_REDIRECTS:
            raise _Failed("too_many_redirects",
                          f"Fetching {first} was redirected more than {MAX_REDIRECTS} times "
                          f"(the last redirect pointed to {answer}).")
        redirects += 1
        hop = _checked(answer, policy)


def _send(hop: _Hop) -> _Page | httpx.URL:
    """The answer from the first of ``hop.addresses`` that accepts a connection: a page, or the
    URL a redirect points to. Only a refused connection moves on to the next address: nothing
    was sent yet."""
    import httpx

    failure: httpx.ConnectError | None = None
    for address in hop.addresses:
        try:
            return _send_to(hop, address)
        except httpx.ConnectError as exc:
            failure = exc
    raise _Failed("fetch_failed",
                  f"Fetching {hop.url} failed: {type(failure).__name__}: {failure}")


def _send_to(hop: _Hop, address: IPAddress) -> _Page | httpx.URL:
    import httpx

    url = hop.url
    # The connection goes to the checked address; the server still sees the name in Host,
    # and TLS sends and verifies the name (httpcore reads the sni_hostname extension).
    pinned = url.copy_with(host=str(address))
    headers = {"Host": url.netloc.decode("ascii")}
    extensions = {} if hop.name is None else {"sni_hostname": hop.name}
    try:
        with _shared_client().stream("GET", pinned, headers=headers, extensions=extensions,
                                     timeout=TIMEOUT_SECONDS) as response:
            if response.has_redirect_location:
                return _redirect_target(url, response.headers["location"])
            return _read(url, response)
    except httpx.TimeoutException:
        raise _Failed("fetch_timeout", f"Fetching {url} timed out after "
                                       f"{TIMEOUT_SECONDS:g} seconds.") from None
    except httpx.ConnectError:
        raise  # the caller tries the next address
    except httpx.HTTPError as exc:
        raise _Failed("fetch_failed",
                      f"Fetching {url} failed: {type(exc).__name__}: {exc}") from None


def _redirect_target(url: httpx.URL, location: str) -> httpx.URL:
    import httpx

    try:
        # Against the URL the model asked for, not the pinned one: a relative Location keeps
        # the name (and is resolved and checked again).
        target = url.join(location)
    except httpx.InvalidURL as exc:
        raise _Failed("fetch_failed", f"{url} redirected to an unreadable URL "
                                      f"{location!r}: {exc}") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise _Failed("fetch_failed", f"{url} redirected to {location!r}, which is not an "
                                      "http:// or https:// URL.")
    return target


def _read(url: httpx.URL, response: httpx.Response) -> _Page:
    body = bytearray()
    truncated = False
    for chunk in response.iter_bytes():
        body.extend(chunk)
        if len(body) > MAX_BYTES:
            truncated = True
            del body[MAX_BYTES:]
            break
    try:
        text = body.decode(response.encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        text = body.decode("utf-8", errors="replace")
    return _Page(url=str(url), status=response.status_code, reason=response.reason_phrase,
                 content_type=response.headers.get("content-type", ""), text=text,
                 truncated=truncated)


_client: httpx.Client | None = None
_client_lock = threading.Lock()


def _shared_client() -> httpx.Client:
    # One client per process: building one loads the TLS trust store (~0.1 s), which would
    # otherwise be paid on every fetch. It keeps no idle connections and no cookies: requests
    # go to pinned addresses, so a kept connection or an address-keyed cookie could be reused
    # for another name on that address. trust_env=False: environment proxies would resolve the
    # name themselves (the checked address would not be the one reached); the CA variables are
    # still read by create_ssl_context.
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                import httpx

                _client = httpx.Client(
                    follow_redirects=False, trust_env=False,
                    verify=httpx.create_ssl_context(trust_env=True),
                    limits=httpx.Limits(max_keepalive_connections=0),
                    cookies=_no_cookies(), headers={"User-Agent": _USER_AGENT})
    return _client


def _no_cookies() -> CookieJar:
    from http.cookiejar import CookieJar, DefaultCookiePolicy

    # An empty allow-list of domains: no cookie is ever stored or sent.
    return CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))


@hookimpl
def register_budgets() -> list[BudgetSpec]:
    """The budget this plugin owns."""
    return [HTTP_FETCHES]


@hookimpl
def register_tools() -> list[Tool]:
    """The tools this plugin offers."""
    return [fetch_url]


def _allow_private_rule(key: str, value: Any) -> None:
    parse_allow_private(value)


@hookimpl
def register_settings() -> list[SettingSpec]:
    """``fetch_allow_private``, checked when written, so a bad value fails at ``settings set``
    rather than at the next fetch (which would refuse anyway)."""
    return [SettingSpec(
        name=ALLOW_PRIVATE_SETTING, type=("boolean", "array"), default=False,
        validator=_allow_private_rule,
        description="false: fetch_url refuses loopback, private, link-local and metadata "
                    'addresses; true: allows every address; a list of networks (["10.0.0.0/8", '
                    '"127.0.0.2"]): allows those.')]
