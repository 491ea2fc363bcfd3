"""Which addresses ``fetch_url`` may connect to (DESIGN.md section 20).

The model chooses the URL, and on a ``/chat`` site a remote caller can steer the model, so an
unguarded fetch tool reaches whatever the *server* can reach: the cloud metadata service with
its credentials, an admin port on loopback, the intranet. This module decides, for one resolved
address, whether a fetch may connect to it: addresses that are not globally routable are
refused unless the site setting ``fetch_allow_private`` allows them.

The decision is made on addresses, never on names: a name is resolved first (every address it
has), and an IPv6 address that only carries an IPv4 one (IPv4-mapped, NAT64, 6to4,
IPv4-compatible) is judged as that IPv4 address, since that is where the packets go.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from datamachine.errors import InvalidSetting

__all__ = [
    "ALLOW_PRIVATE_SETTING",
    "AllowPrivate",
    "IPAddress",
    "address_class",
    "describe_class",
    "parse_allow_private",
    "resolve",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_PRIVATE_SETTING = "fetch_allow_private"


def _networks(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


# Instance metadata services hand out cloud credentials: named on their own so the refusal says
# what was at stake. AWS/GCP/Azure/OCI (and AWS's IPv6 endpoint), AWS ECS task metadata,
# Alibaba Cloud.
_METADATA = frozenset(ipaddress.ip_address(text) for text in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200"))

# Checked in order; the first match names the class. Whatever is left and still not globally
# routable (documentation, benchmarking, 240/4, broadcast, ...) is "reserved".
_CLASSES: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _networks("0.0.0.0/8", "::/128")),
    ("loopback", _networks("127.0.0.0/8", "::1/128")),
    ("link-local", _networks("169.254.0.0/16", "fe80::/10")),
    # fec0::/10 (deprecated site-local) still routes inside sites; Python 3.11 calls it global.
    ("private", _networks("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7",
                          "fec0::/10")),
    ("shared", _networks("100.64.0.0/10")),
    # Python counts IPv4 multicast as global; a fetch has no business there either.
    ("multicast", _networks("224.0.0.0/4", "ff00::/8")),
)

_DESCRIPTIONS = {
    "metadata": "cloud metadata",
    "shared": "shared (carrier-grade NAT)",
    "reserved": "reserved (not globally routable)",
}

# IPv6 forms whose packets go to the IPv4 address in their last 32 bits.
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE = ipaddress.IPv6Network("::/96")


@dataclass(frozen=True)
class AllowPrivate:
    """The parsed ``fetch_allow_private`` setting.

    ``everything``: every address is allowed (the setting is ``true``). Otherwise only the
    addresses inside ``networks`` are allowed besides the public ones (the setting is a list);
    the default, no networks, allows public addresses only.
    """

    everything: bool = False
    networks: tuple[IPNetwork, ...] = ()

    def allows(self, address: IPAddress) -> bool:
        """Whether the setting lets a fetch connect to ``address`` even if it is not public."""
        if self.everything:
            return True
        candidates = [address]
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            candidates.append(embedded)
        return any(candidate in network for candidate in candidates for network in self.networks)

    def refuses(self, address: IPAddress) -> str | None:
        """The class that keeps a fetch away from ``address`` (see :func:`address_class`), or
        None when the fetch may connect to it."""
        return None if self.allows(address) else address_class(address)


def parse_allow_private(value: object) -> AllowPrivate:
    """Read a ``fetch_allow_private`` value: ``false``, ``true`` or a list of networks.

    A list holds CIDR strings or single addresses (``"10.0.0.0/8"``, ``"127.0.0.2"``). Anything
    else raises :class:`~datamachine.errors.InvalidSetting` naming the setting: the guard fails
    closed, because a typo that silently meant "allow everything" would open the metadata
    service to every model.
    """
    if value is False:
        return AllowPrivate()
    if value is True:
        return AllowPrivate(everything=True)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return AllowPrivate(networks=tuple(_network(item, value) for item in value))
    raise InvalidSetting(_invalid(value))


def _network(item: str, value: object) -> IPNetwork:
    try:
        # strict: "10.0.0.1/8" is more likely a typo than a wish for all of 10/8.
        return ipaddress.ip_network(item.strip(), strict=True)
    except ValueError as exc:
        raise InvalidSetting(_invalid(value, f"{item!r} is not a network: {exc}")) from None


def _invalid(value: object, detail: str = "") -> str:
    return (f"Setting {ALLOW_PRIVATE_SETTING!r} must be false (the default: fetch_url refuses "
            "loopback, private, link-local and metadata addresses), true (allow every address) "
            'or a list of networks to allow, such as ["10.0.0.0/8", "127.0.0.2"]; got '
            f"{value!r}{f' ({detail})' if detail else ''}.")


def address_class(address: IPAddress) -> str | None:
    """Why ``address`` is not public: ``"metadata"``, ``"unspecified"``, ``"loopback"``,
    ``"link-local"``, ``"private"``, ``"shared"``, ``"multicast"`` or ``"reserved"``; None for
    a globally routable address.

    An IPv6 address carrying an IPv4 address is refused when that IPv4 address is; an
    IPv4-mapped or NAT64 address is judged only by its IPv4 address, since that is the host it
    reaches.
    """
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        found = _own_class(embedded)
        if found is not None or address in _MAPPED or address in _NAT64:
            return found
    return _own_class(address)


def describe_class(name: str) -> str:
    """The words for an :func:`address_class` in a message: ``"cloud metadata"``, ..."""
    return _DESCRIPTIONS.get(name, name)


def _own_class(address: IPAddress) -> str | None:
    if address in _METADATA:
        return "metadata"
    for name, networks in _CLASSES:
        if any(address in network for network in networks):
            return name
    # is_reserved as well: Python counts some reserved IPv6 ranges (::/8) as global.
    if address.is_reserved or not address.is_global:
        return "reserved"
    return None


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address in _MAPPED or address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _COMPATIBLE and int(address) > 1:  # not :: nor ::1, which are their own
        return ipaddress.IPv4Address(int(address))
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` has for a TCP connection, in the resolver's order, each once.

    Raises ``OSError`` (``socket.gaierror``) when the name does not resolve. ``fetch_url`` looks
    this function up on its package at each call, so a test can stand in for DNS.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return _unique(ipaddress.ip_address(info[4][0]) for info in infos)


def _unique(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    return list(dict.fromkeys(addresses))
