"""Where an HTTP environment may be reached. A tenant names its environment server by URL and
retrace's services, inside the deployment, call it: without limits that is a request to any
address the deployment can reach (its database, its model server, a cloud's instance
metadata with its credentials) whose answer comes back quoted in an error.

- The URL is a base: `http(s)://host[:port][/path]`, no user, query or fragment (those let
  a URL drop the protocol's paths and choose any: `http://host/secret?` or `#`).
- Never reached, whoever named it: link-local addresses (instance metadata at
  169.254.169.254, fe80::/10), the metadata addresses outside them (`fd00:ec2::254`,
  `100.100.100.200`), multicast, unspecified and reserved ones, also as IPv4 in IPv6. The
  services resolve a name through `GuardedResolver`, which refuses such an answer, so a
  name cannot point there between a check and the connection.
- A tenant's URL (the control API) must also be public (`ipaddress`'s `is_global`) unless
  the operator allows private and loopback ones (`RETRACE_API_TENANT_ENVIRONMENTS_PRIVATE`):
  `tenant_url_refusal`. That is checked when the URL is named; a name can point elsewhere
  later (DNS rebinding). So at every connection a private or loopback answer is taken only
  for a name that cannot be anyone's on the internet (`inner_name`): one label (a compose
  service, `localhost`) or under the suffixes reserved for inner networks (`.internal`,
  `.local`, `.localhost`, `.home.arpa`, `.test`), or one the operator lists
  (`RETRACE_ENVIRONMENTS_PRIVATE_HOSTS`); an address written in the URL is what it is. A
  deployment whose environment servers are all public refuses private and loopback answers
  at every connection: `RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false`. (`allow_private` takes
  both; every service sets them at its start, the CLI too.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver

from shared.errors import PermanentError

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "169.254.169.254")
)
"""Cloud instance-metadata addresses (AWS over IPv6, Alibaba; the link-local one of most)."""


INNER_SUFFIXES = (".internal", ".local", ".localhost", ".home.arpa", ".test")
"""Names under these are never given out on the internet (ICANN's private-use `.internal`,
mDNS's `.local`, RFC 6761's and RFC 8375's), so no tenant can make one answer an inner
address later: they may lead to private and loopback addresses, as may a name of one label."""

_private_allowed = True
"""This process's policy (`allow_private`): whether a connection may reach a private or
loopback address."""
_private_hosts: tuple[str, ...] = ()
"""Names beyond `inner_name`'s own that may lead there (`allow_private`)."""


def allow_private(allowed: bool, hosts: Sequence[str] = ()) -> None:
    """Set whether this process's connections to environments may reach private and loopback
    addresses, and the names besides `inner_name`'s that may lead there (`*.suffix` for
    every name under one); `EnvironmentsConfig`, set by a service at its start."""
    global _private_allowed, _private_hosts
    _private_allowed = allowed
    _private_hosts = tuple(h.strip().lower().rstrip(".") for h in hosts if h.strip())


def inner_name(host: str) -> bool:
    """Whether `host` may lead to a private or loopback address: an address written out, a
    name of one label, a name under `INNER_SUFFIXES`, or one the operator listed
    (`allow_private`). Any other name is one the internet's DNS answers, whose owner can
    make it answer an inner address after it was checked (DNS rebinding)."""
    if _literal(host.strip()) is not None:
        return True
    try:  # as the resolver will ask it: `attacker。com` is `attacker.com` (a review found it)
        name = host.strip().encode("idna").decode("ascii").lower().rstrip(".")
    except UnicodeError:
        return False
    if "." not in name or name.endswith(INNER_SUFFIXES):
        return True
    return any(
        name.endswith(pattern[1:]) if pattern.startswith("*.") else name == pattern
        for pattern in _private_hosts
    )


class EnvironmentAddressError(PermanentError):
    """An environment URL that retrace will not call (its shape, or where it leads)."""


def checked_url(url: str) -> str:
    """`url` if it is a base URL an environment may have, else an `EnvironmentAddressError`
    saying what is wrong. A host given as an address is checked here (`connect_refusal`); a
    name is checked when it is resolved."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EnvironmentAddressError(
            f"environment URL {url[:200]!r} is malformed: {exc}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EnvironmentAddressError(
            f"environment URL {url[:200]!r} must be http(s)://host[:port][/path]"
        )
    if parts.username is not None or parts.password is not None:
        raise EnvironmentAddressError(
            f"environment URL {url[:200]!r} carries a user or password: give the base URL only"
        )
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise EnvironmentAddressError(
            f"environment URL {url[:200]!r} has a query or fragment: give the base URL only "
            "(the protocol's paths are added to it)"
        )
    if port == 0:
        raise EnvironmentAddressError(f"environment URL {url[:200]!r} names port 0")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise EnvironmentAddressError(f"environment URL {url[:200]!r} contains whitespace")
    if "%" in parts.hostname and ":" not in parts.hostname:
        raise EnvironmentAddressError(
            f"environment URL {url[:200]!r}: a host name has no '%' (only an IPv6 address's "
            "zone does)"
        )
    literal = _literal(parts.hostname)
    if literal is not None and (why := connect_refusal(literal, parts.hostname)) is not None:
        raise EnvironmentAddressError(f"environment URL {url[:200]!r} leads to {why}")
    return url


def refusal(ip: IpAddress) -> str | None:
    """Why no environment is reached at `ip`, or None."""
    address = _leads_to(ip)
    if address in METADATA:
        return f"a cloud instance-metadata address ({ip})"
    if address.is_link_local:
        return f"a link-local address ({ip})"
    if address.is_multicast or address.is_unspecified:
        return f"an address no server has ({ip})"
    if address.is_reserved and not (address.is_loopback or address.is_private):
        return f"an address no server has ({ip})"  # (::1 lies in a reserved block)
    return None


def connect_refusal(ip: IpAddress, host: str) -> str | None:
    """Why no connection to an environment is made to `ip`, an address of `host`, in this
    process, or None: `refusal`, then a private one where this process allows none
    (`allow_private`) or `host` is a name that should not lead there (`inner_name`)."""
    return named_refusal(ip, host, _private_allowed)


def named_refusal(ip: IpAddress, host: str, private_allowed: bool) -> str | None:
    """Why `host` may not lead to `ip`, or None: `tenant_refusal`, then an inner address
    under a name that should not lead there (`inner_name`)."""
    why = tenant_refusal(ip, private_allowed)
    if why is None and not _leads_to(ip).is_global and not inner_name(host):
        return _rebinding(ip, host)
    return why


def _rebinding(ip: IpAddress, host: str) -> str:
    return (
        f"an inner address ({ip}: private, or this machine's) under a name the internet's "
        f"DNS answers ({host[:200]!r}: DNS rebinding); an operator's inner server "
        "is named by its address, one label, a name under "
        f"{', '.join(INNER_SUFFIXES)}, or one listed in RETRACE_ENVIRONMENTS_PRIVATE_HOSTS"
    )


def tenant_refusal(ip: IpAddress, private_allowed: bool) -> str | None:
    """Why a tenant's environment may not be at `ip`, or None: `refusal`, then (unless the
    operator allows them) an address that is not public."""
    why = refusal(ip)
    if why is not None or private_allowed:
        return why
    if not _leads_to(ip).is_global:
        return f"an address inside a private network or this machine ({ip})"
    return None


async def tenant_url_refusal(url: str, private_allowed: bool) -> str | None:
    """Why the control API refuses a tenant's environment URL, or None: its shape
    (`checked_url`), then every address its host resolves to (`tenant_refusal`). The URL is
    not fetched."""
    try:
        checked_url(url)
    except EnvironmentAddressError as exc:
        return str(exc)
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port or 80, type=socket.SOCK_STREAM
        )
    except (OSError, UnicodeError) as exc:
        return f"environment host {host[:200]!r} does not resolve: {exc}"
    for *_, sockaddr in found:
        # the services would refuse an inner address under a public name at every call
        why = named_refusal(_ip(str(sockaddr[0])), host, private_allowed)
        if why is not None:
            return f"environment URL {url[:200]!r} leads to {why}"
    return None


def check_resolved(host: str, port: int) -> str:
    """Resolve `host` now and refuse it where any of its addresses is refused
    (`connect_refusal`); else the address to connect to, for a caller that cannot use
    `GuardedResolver` and connects to that address itself (resolving the name again could
    give another: DNS rebinding). OSError where it does not resolve."""
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except UnicodeError as exc:
            raise OSError(f"environment host {host[:200]!r} cannot be resolved: {exc}") from None
        addresses = [_ip(str(s[0])) for *_, s in found]
    for ip in addresses:
        why = connect_refusal(ip, host)
        if why is not None:
            raise EnvironmentAddressError(f"environment host {host!r} leads to {why}")
    return str(addresses[0])


class GuardedResolver(ThreadedResolver):
    """aiohttp's resolver, refusing a name any of whose addresses is refused
    (`connect_refusal`) with an `EnvironmentAddressError`, which is not retried."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await super().resolve(host, port, family)
        for result in found:
            why = connect_refusal(_ip(result["host"]), host)
            if why is not None:
                raise EnvironmentAddressError(f"environment host {host!r} leads to {why}")
        return found


def _leads_to(ip: IpAddress) -> IpAddress:
    """The address a connection to `ip` reaches: an IPv4 one written in IPv6 is that one."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def _ip(text: str) -> IpAddress:
    """An address as resolvers write it (an IPv6 one may end in its zone, `%eth0`)."""
    return ipaddress.ip_address(text.split("%", 1)[0])


def _literal(host: str) -> IpAddress | None:
    """The address `host` writes out, or None for a name. A zone (`%eth0`) only after an
    IPv6 address: `127.0.0.1%x.attacker.com` is a name (a review found it)."""
    if "%" in host and ":" not in host:
        return None
    try:
        return _ip(host)
    except ValueError:
        return None
