"""fetch_url's address guard (DESIGN.md section 20), against real servers on loopback.

127.0.0.1 plays the private service the guard protects; 127.0.0.2 (also loopback on Linux)
plays a server the site allows with ``fetch_allow_private = ["127.0.0.2/32"]``. DNS is stood in
for by replacing ``datamachine_fetch.resolve``, so names can point anywhere without internet.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datamachine_fetch
import pytest
from datamachine_fetch import MAX_REDIRECTS, address_class, fetch_url, parse_allow_private
from fetch_servers import Server, certificates, fetch

import bootstrap
from agents_api import IterationBudget
from datamachine.errors import InvalidSetting
from datamachine.host import Host
from datamachine.tools import ToolExecutor

ALLOWED = "127.0.0.2"


@pytest.fixture
def host() -> Iterator[Host]:
    """A host with the default setting: only public addresses."""
    with bootstrap.boot(db_path=":memory:", plugins=[datamachine_fetch],
                        load_entrypoints=False) as booted:
        yield booted


@pytest.fixture
def private() -> Iterator[Server]:
    """The service the guard protects, on 127.0.0.1."""
    with Server("127.0.0.1") as running:
        yield running


@pytest.fixture
def allowed(private: Server) -> Iterator[Server]:
    """A server the site allows, on 127.0.0.2 and on the same port as ``private``: a client
    that looked a name up again would reach ``private`` instead."""
    with Server(ALLOWED, private.port) as running:
        yield running


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Fails any TCP connection attempt (httpx connects through socket.create_connection)."""
    attempts: list[tuple[Any, ...]] = []

    def refuse(*args: Any, **kwargs: Any) -> socket.socket:
        attempts.append(args)
        raise AssertionError(f"fetch_url tried to connect to {args[0]}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def dns(monkeypatch: pytest.MonkeyPatch, *answers: list[str]) -> list[str]:
    """Stand in for DNS: the n-th lookup gets ``answers[n]`` (the last one from then on).
    Returns the names looked up."""
    asked: list[str] = []

    def resolve(name: str, port: int) -> list[Any]:
        asked.append(name)
        answer = answers[min(len(asked), len(answers)) - 1]
        return [ipaddress.ip_address(text) for text in answer]

    monkeypatch.setattr(datamachine_fetch, "resolve", resolve)
    return asked


def allow(host: Host, value: object) -> ToolExecutor:
    host.settings.set("fetch_allow_private", value)
    return ToolExecutor([fetch_url], host=host)


# -- refused by default -------------------------------------------------------------------------

def test_loopback_is_refused_by_default_before_any_request_or_budget(
    host: Host, private: Server
) -> None:
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url], host=host), f"{private.url}/page", budgets)
    assert result == {"tool_name": "fetch_url", "parameters": {"url": f"{private.url}/page"},
        "success": False, "error_type": "address_not_allowed",
        "error": (f"fetch_url refused {private.url}/page: 127.0.0.1 is a loopback address. "
                  "This site does not allow fetching loopback, private, link-local or metadata "
                  "addresses; the site setting 'fetch_allow_private' can allow them (true, or a "
                  "list of networks)."),
        "url": f"{private.url}/page", "host": "127.0.0.1", "address": "127.0.0.1",
        "address_class": "loopback"}
    assert private.seen == []
    assert budgets["http_fetches"].current() == 0


def test_a_run_outside_a_host_gets_the_safe_default(private: Server) -> None:
    result = fetch(ToolExecutor([fetch_url]), f"{private.url}/page", {})
    assert result["error_type"] == "address_not_allowed"
    assert private.seen == []


def test_setting_true_allows_loopback(host: Host, private: Server) -> None:
    result = fetch(allow(host, True), f"{private.url}/page", {})
    assert result["success"] is True
    assert private.paths == ["/page"]


def test_a_name_for_loopback_is_refused(host: Host, private: Server) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), f"http://localhost:{private.port}/", {})
    assert result["error_type"] == "address_not_allowed"
    assert result["host"] == "localhost"
    assert result["address_class"] == "loopback"
    assert f"localhost resolves to {result['address']}, a loopback address" in result["error"]
    assert private.seen == []


@pytest.mark.parametrize(("url", "address", "kind"), [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254", "metadata"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "fd00:ec2::254", "metadata"),
    ("http://[::1]/", "::1", "loopback"),
    ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1", "loopback"),
    ("http://[64:ff9b::7f00:1]/", "64:ff9b::7f00:1", "loopback"),  # NAT64
    ("http://[2002:7f00:1::]/", "2002:7f00:1::", "loopback"),  # 6to4
    ("http://10.0.0.1/", "10.0.0.1", "private"),
    ("http://172.16.5.4/", "172.16.5.4", "private"),
    ("http://192.168.1.1/", "192.168.1.1", "private"),
    ("http://[fc00::1]/", "fc00::1", "private"),
    ("http://[fec0::1]/", "fec0::1", "private"),  # deprecated site-local
    ("http://100.64.0.1/", "100.64.0.1", "shared"),
    ("http://0.0.0.0:8080/", "0.0.0.0", "unspecified"),
    ("http://169.254.1.1/", "169.254.1.1", "link-local"),
    ("http://[fe80::1]/", "fe80::1", "link-local"),
    ("http://224.0.0.1/", "224.0.0.1", "multicast"),
    ("http://240.0.0.1/", "240.0.0.1", "reserved"),
    ("http://192.0.2.1/", "192.0.2.1", "reserved"),  # documentation
])
def test_address_literals_are_refused_without_dns_or_a_connection(
    host: Host, monkeypatch: pytest.MonkeyPatch, no_connections: list[tuple[Any, ...]],
    url: str, address: str, kind: str,
) -> None:
    looked_up = dns(monkeypatch, ["8.8.8.8"])
    result = fetch(ToolExecutor([fetch_url], host=host), url, {})
    assert (result["error_type"], result["address"], result["address_class"]) == (
        "address_not_allowed", address, kind)
    assert "fetch_allow_private" in result["error"]
    assert looked_up == []
    assert no_connections == []


def test_metadata_is_named_in_the_refusal(host: Host) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), "http://169.254.169.254/", {})
    assert "169.254.169.254 is a cloud metadata address" in result["error"]


@pytest.mark.parametrize("url", ["http://127.1/", "http://2130706433/", "http://0x7f000001/"])
def test_other_spellings_of_loopback_are_resolved_then_refused(
    host: Host, no_connections: list[tuple[Any, ...]], url: str
) -> None:
    result = fetch(ToolExecutor([fetch_url], host=host), url, {})
    assert (result["address"], result["address_class"]) == ("127.0.0.1", "loopback")
    assert no_connections == []


def test_a_name_with_any_refused_address_is_refused(
    host: Host, allowed: Server, private: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns(monkeypatch, [ALLOWED, "127.0.0.1"])
    result = fetch(allow(host, [f"{ALLOWED}/32"]), f"http://two.test:{allowed.port}/page", {})
    assert (result["error_type"], result["address"]) == ("address_not_allowed", "127.0.0.1")
    assert "two.test resolves to 127.0.0.1, a loopback address" in result["error"]
    assert allowed.seen == private.seen == []


# -- redirects ----------------------------------------------------------------------------------

def test_a_redirect_to_a_refused_address_is_refused_before_it_is_requested(
    host: Host, private: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Server(ALLOWED, redirect_to=f"{private.url}/page") as site:
        budgets: dict[str, IterationBudget] = {}
        result = fetch(allow(host, [f"{ALLOWED}/32"]), f"{site.url}/away", budgets)
    assert (result["error_type"], result["address"]) == ("address_not_allowed", "127.0.0.1")
    assert result["url"] == f"{private.url}/page"
    assert site.paths == ["/away"]
    assert private.seen == []  # the second hop never left the client
    assert budgets["http_fetches"].current() == 1  # the first hop was a fetch


def test_a_name_that_rebinds_between_redirects_is_checked_again(
    host: Host, allowed: Server, private: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up = dns(monkeypatch, [ALLOWED], ["127.0.0.1"])
    result = fetch(allow(host, [f"{ALLOWED}/32"]), f"http://rebind.test:{allowed.port}/redirect",
                   {})
    assert (result["error_type"], result["host"], result["address"]) == (
        "address_not_allowed", "rebind.test", "127.0.0.1")
    assert result["url"] == f"http://rebind.test:{allowed.port}/page"  # relative Location
    assert looked_up == ["rebind.test", "rebind.test"]
    assert allowed.paths == ["/redirect"]
    assert private.seen == []


def test_too_many_redirects_is_a_failed_result(host: Host) -> None:
    with Server(ALLOWED) as site:
        result = fetch(allow(host, [ALLOWED]), f"{site.url}/loop", {})
    assert result["error_type"] == "too_many_redirects"
    assert result["error"] == (f"Fetching {site.url}/loop was redirected more than "
                               f"{MAX_REDIRECTS} times (the last redirect pointed to "
                               f"{site.url}/loop).")
    assert len(site.seen) == MAX_REDIRECTS + 1


def test_a_redirect_to_another_scheme_is_a_failed_result(host: Host) -> None:
    with Server(ALLOWED, redirect_to="file:///etc/passwd") as site:
        result = fetch(allow(host, [ALLOWED]), f"{site.url}/away", {})
    assert result["error_type"] == "fetch_failed"
    assert "which is not an http:// or https:// URL" in result["error"]


# -- the connection goes to the checked address -------------------------------------------------

def test_the_request_goes_to_the_checked_address_with_the_name_in_host(
    host: Host, allowed: Server, private: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lookup after the check would answer 127.0.0.1, where `private` listens on the same port.
    looked_up = dns(monkeypatch, [ALLOWED], ["127.0.0.1"])
    url = f"http://rebind.test:{allowed.port}/page"
    result = fetch(allow(host, [f"{ALLOWED}/32"]), url, {})
    assert result["success"] is True
    assert result["result"]["url"] == url
    assert [(seen.path, seen.host) for seen in allowed.seen] == [
        ("/page", f"rebind.test:{allowed.port}")]
    assert private.seen == []
    assert looked_up == ["rebind.test"]
    # The name now answers 127.0.0.1: refused, and still nothing reaches `private`.
    assert fetch(allow(host, [f"{ALLOWED}/32"]), url, {})["error_type"] == "address_not_allowed"
    assert private.seen == []


def test_an_address_that_refuses_the_connection_falls_through_to_the_next(
    host: Host, allowed: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns(monkeypatch, ["127.0.0.3", ALLOWED])  # nothing listens on 127.0.0.3
    result = fetch(allow(host, ["127.0.0.3", ALLOWED]), f"http://two.test:{allowed.port}/page",
                   {})
    assert result["success"] is True
    assert allowed.paths == ["/page"]


def test_fetches_share_no_connection_and_no_cookies(
    host: Host, allowed: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    dns(monkeypatch, [ALLOWED])
    executor = allow(host, [ALLOWED])
    for number, name in enumerate(("one.test", "one.test", "two.test")):
        url = f"http://{name}:{allowed.port}/cookie?n={number}"
        assert fetch(executor, url, {}, call_id=f"c{number}")["success"] is True
    assert [seen.cookie for seen in allowed.seen] == [None, None, None]
    assert len({seen.client_port for seen in allowed.seen}) == 3


@pytest.fixture
def fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """fetch_url builds its shared client again, seeing the environment the test set."""
    monkeypatch.setattr(datamachine_fetch, "_client", None)
    yield
    built = datamachine_fetch._client
    if built is not None:
        built.close()


def test_environment_proxies_are_not_used(
    host: Host, allowed: Server, monkeypatch: pytest.MonkeyPatch,
    fresh_client: None,
) -> None:
    with Server("127.0.0.1") as proxy:  # would see absolute-form requests if used
        for variable in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(variable, proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        result = fetch(allow(host, [ALLOWED]), f"{allowed.url}/page", {})
    assert result["success"] is True
    assert allowed.paths == ["/page"]
    assert proxy.seen == []


@pytest.mark.parametrize(("certified", "works"), [("secure.test", True), ("other.test", False)])
def test_tls_checks_the_certificate_against_the_name_not_the_address(
    host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    fresh_client: None, certified: str, works: bool,
) -> None:
    pytest.importorskip("cryptography")
    ca_file, context = certificates(tmp_path, certified)
    names: list[str | None] = []

    def record(connection: ssl.SSLObject, name: str | None, server: ssl.SSLContext) -> None:
        names.append(name)

    context.sni_callback = record
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    dns(monkeypatch, [ALLOWED])
    with Server(ALLOWED, tls=context) as site:
        result = fetch(allow(host, [ALLOWED]), f"https://secure.test:{site.port}/page", {})
    assert names == ["secure.test"]
    if works:
        assert result["result"]["text"] == "<h1>Héllo</h1>"
        assert [seen.host for seen in site.seen] == [f"secure.test:{site.port}"]
    else:
        assert result["error_type"] == "fetch_failed"
        assert "CERTIFICATE_VERIFY_FAILED" in result["error"]
        assert site.seen == []


# -- the setting --------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", ["yes", "1", '["not-a-network"]', '["10.0.0.1/8"]', '{"a": 1}',
                                 "null"])
def test_a_bad_setting_fails_closed(
    host: Host, private: Server, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    # The environment overrides the stored value and is not validated on the way in.
    monkeypatch.setenv("DATAMACHINE_FETCH_ALLOW_PRIVATE", raw)
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url], host=host), f"{private.url}/page", budgets)
    assert result["error_type"] == "invalid_setting"
    assert "Setting 'fetch_allow_private' must be false" in result["error"]
    assert private.seen == []
    assert "http_fetches" not in budgets


def test_a_bad_setting_is_refused_when_written(host: Host) -> None:
    with pytest.raises(InvalidSetting, match=r"'fetch_allow_private' must be false.*got 'yes'"):
        host.settings.set("fetch_allow_private", "yes")
    host.settings.set("fetch_allow_private", ["10.0.0.0/8", "fd00::/8", "127.0.0.2"])


def test_parse_allow_private_reads_the_three_forms() -> None:
    assert not parse_allow_private(False).allows(ipaddress.ip_address("127.0.0.1"))
    assert parse_allow_private(True).allows(ipaddress.ip_address("169.254.169.254"))
    listed = parse_allow_private(["10.0.0.0/8", " 127.0.0.2 "])
    assert [str(network) for network in listed.networks] == ["10.0.0.0/8", "127.0.0.2/32"]
    assert listed.refuses(ipaddress.ip_address("10.1.2.3")) is None
    assert listed.refuses(ipaddress.ip_address("::ffff:127.0.0.2")) is None
    assert listed.refuses(ipaddress.ip_address("127.0.0.1")) == "loopback"
    assert parse_allow_private([]).refuses(ipaddress.ip_address("10.1.2.3")) == "private"


@pytest.mark.parametrize("value", [None, "true", 0, 1, {"a": 1}, ["10.0.0.0/8", 5],
                                   ["10.0.0.1/8"], ["intranet"]])
def test_parse_allow_private_refuses_anything_else(value: object) -> None:
    with pytest.raises(InvalidSetting, match="'fetch_allow_private' must be false"):
        parse_allow_private(value)


@pytest.mark.parametrize("public", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111",
                                    "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"])
def test_public_addresses_have_no_class(public: str) -> None:
    assert address_class(ipaddress.ip_address(public)) is None


def test_refusals_are_the_same_for_a_name_and_its_address(
    host: Host, monkeypatch: pytest.MonkeyPatch, no_connections: list[tuple[Any, ...]]
) -> None:
    dns(monkeypatch, ["169.254.169.254"])
    result = fetch(ToolExecutor([fetch_url], host=host), "http://metadata.test/computeMetadata/",
                   {})
    assert (result["address_class"], result["host"]) == ("metadata", "metadata.test")
    assert no_connections == []


def test_a_name_that_does_not_resolve_uses_no_budget(
    host: Host, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nowhere(name: str, port: int) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(datamachine_fetch, "resolve", nowhere)
    budgets: dict[str, IterationBudget] = {}
    result = fetch(ToolExecutor([fetch_url], host=host), "http://nowhere.test/", budgets)
    assert result["error_type"] == "fetch_failed"
    assert "the host 'nowhere.test' does not resolve" in result["error"]
    assert budgets["http_fetches"].current() == 0

