"""Where an HTTP environment may be reached (`shared.envs.remote.address`): a base URL only,
never a link-local or metadata address however it is written or resolved, and for a tenant
(unless the operator allows it) a public one."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config import ServiceConfig, load_config
from shared.envs.remote.address import (
    EnvironmentAddressError,
    GuardedResolver,
    allow_private,
    check_resolved,
    checked_url,
    inner_name,
    refusal,
    tenant_refusal,
    tenant_url_refusal,
)
from shared.envs.remote.client import HttpEnvironment

ip = ipaddress.ip_address


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "http://100.100.100.200/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1%25eth0]:8600",
        "http://0.0.0.0:8600",
        "http://224.0.0.1/",
        "http://host/secret?",
        "http://host/secret#",
        "http://user@host/",
        "ftp://host/",
        "http:///path",
        "http://host:0/",
        "http://host:99999/",
        "http://ho st/",
    ],
)
def test_urls_no_environment_is_reached_at(url: str) -> None:
    with pytest.raises(EnvironmentAddressError):
        checked_url(url)
    with pytest.raises(EnvironmentAddressError):
        HttpEnvironment(url)  # refused before anything is sent


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8600", "https://env.example.com/v2/", "http://[::1]:9000/base"]
)
def test_base_urls_are_kept_as_given(url: str) -> None:
    assert checked_url(url) == url


@given(st.text(max_size=80).map(lambda t: "http://" + t) | st.text(max_size=80))
def test_a_url_passed_is_a_base_url_that_leads_nowhere_refused(url: str) -> None:
    try:
        kept = checked_url(url)
    except EnvironmentAddressError:
        return
    parts = urlsplit(kept)
    assert parts.scheme in ("http", "https") and parts.hostname
    assert not parts.query and not parts.fragment and parts.username is None
    try:
        literal = ip(parts.hostname.split("%")[0])
    except ValueError:
        return
    assert refusal(literal) is None


def test_which_addresses_a_tenant_may_name() -> None:
    assert tenant_refusal(ip("8.8.8.8"), private_allowed=False) is None
    for private in ("127.0.0.1", "10.0.0.5", "192.168.1.1", "::1", "fc00::1", "100.64.0.1"):
        assert "private" in (tenant_refusal(ip(private), private_allowed=False) or ""), private
        assert tenant_refusal(ip(private), private_allowed=True) is None
    assert "metadata" in (tenant_refusal(ip("169.254.169.254"), private_allowed=True) or "")
    assert "private" in (tenant_refusal(ip("::ffff:10.0.0.1"), private_allowed=False) or "")


async def test_a_tenant_url_is_checked_where_its_name_leads() -> None:
    assert "private" in (await tenant_url_refusal("http://localhost:8600", False) or "")
    assert await tenant_url_refusal("http://localhost:8600", True) is None
    assert "resolve" in (await tenant_url_refusal("http://no-such-host.invalid/", False) or "")
    assert "query" in (await tenant_url_refusal("http://8.8.8.8/?x", False) or "")


class _Answers(GuardedResolver):
    """The guard over a resolver that answers `addresses` (a name's DNS answer)."""

    def __init__(self, *addresses: str) -> None:
        super().__init__()
        self.addresses = addresses

    async def _answer(self, host: str, port: int) -> list[Any]:
        return [
            {
                "hostname": host,
                "host": a,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
            for a in self.addresses
        ]


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_Answers` resolvers answer their own addresses (no DNS asked)."""

    async def answered(self: _Answers, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return await self._answer(host, port)

    monkeypatch.setattr("aiohttp.resolver.ThreadedResolver.resolve", answered)


async def test_a_name_that_resolves_to_metadata_is_refused(answering: None) -> None:
    """A tenant's name can point anywhere after the API checked it: the services' resolver
    refuses the answer itself."""

    with pytest.raises(EnvironmentAddressError, match="metadata"):
        await _Answers("10.0.0.1", "169.254.169.254").resolve("env.internal", 80)
    with pytest.raises(EnvironmentAddressError, match="metadata"):
        await _Answers("93.184.216.34", "169.254.169.254").resolve("env.example.com", 80)
    assert [r["host"] for r in await _Answers("10.0.0.1").resolve("env.internal", 80)] == [
        "10.0.0.1"
    ]


def test_a_name_resolved_before_the_task_list_is_checked() -> None:
    check_resolved("localhost", 80)  # loopback: the operator's own server may be there
    with pytest.raises(EnvironmentAddressError, match="metadata"):
        check_resolved("169.254.169.254", 80)
    with pytest.raises(EnvironmentAddressError, match="metadata"):
        check_resolved("2852039166", 80)  # 169.254.169.254 as one number, which resolves


@pytest.fixture
def public_only() -> Iterator[None]:
    """This process as a service of a deployment that reaches no private address."""
    allow_private(False)
    try:
        yield
    finally:
        allow_private(True)


async def test_where_private_addresses_are_not_allowed_no_answer_leads_there(
    answering: None, public_only: None
) -> None:
    """Review of issue 14 (DNS rebinding): a tenant's name resolved to a public address when
    the control API checked it and to an inner one when a service connects. Where the
    deployment allows no private address (`RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false`), the
    services' resolver refuses that answer; the address written in the URL too."""

    for inner in ("10.0.0.1", "127.0.0.1", "192.168.1.20", "::1", "::ffff:10.0.0.1"):
        with pytest.raises(EnvironmentAddressError, match="private network or this machine"):
            await _Answers("93.184.216.34", inner).resolve("env.example.com", 80)
    assert [r["host"] for r in await _Answers("93.184.216.34").resolve("env.example.com", 80)] == [
        "93.184.216.34"
    ]
    with pytest.raises(EnvironmentAddressError, match="private network"):
        check_resolved("localhost", 80)
    with pytest.raises(EnvironmentAddressError, match="private network"):
        HttpEnvironment("http://127.0.0.1:9/")  # refused before any connection


def test_the_deployment_s_setting_is_read_as_every_service_reads_its_config() -> None:
    assert load_config(ServiceConfig, env={}).environments.private_allowed
    cfg = load_config(ServiceConfig, env={"RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED": "false"})
    assert not cfg.environments.private_allowed


@pytest.fixture
def operator_hosts() -> Iterator[None]:
    allow_private(True, [" *.Corp.Example ", "envs.mycorp.com.", ""])
    try:
        yield
    finally:
        allow_private(True)


@pytest.mark.parametrize(
    ("host", "inner"),
    [
        ("pantry", True),  # a compose service
        ("LOCALHOST.", True),
        ("10.0.0.7", True),  # an address written out: nothing to rebind
        ("::1", True),
        ("env.internal", True),
        ("printer.local", True),
        ("a.b.localhost", True),
        ("nas.home.arpa", True),
        ("desk.rebinding.test", True),
        ("env.example.com", False),
        ("internal.example.com", False),
        ("evil.test.example.com", False),
        ("envs.corp.example", True),  # listed by the operator (below)
        ("a.b.corp.example", True),
        ("corp.example", False),  # `*.corp.example` is the names under it
        ("evilcorp.example", False),
        ("envs.mycorp.com", True),
        ("evil-envs.mycorp.com", False),
        ("x.envs.mycorp.com", False),
        # review: what the resolver asks is not always what is written
        ("attacker\u3002com", False),  # an ideographic full stop: IDNA makes it a dot
        ("attacker\uff0ecom", False),
        ("attacker\uff61com", False),
        ("env\u3002internal", True),
        ("127.0.0.1%x.attacker.com", False),  # a zone only after an IPv6 address
        ("fe80::1%eth0", True),
        ("a..b", False),  # no name IDNA can write
    ],
)
def test_which_names_may_lead_inside(operator_hosts: None, host: str, inner: bool) -> None:
    assert inner_name(host) is inner


async def test_a_public_name_that_answers_an_inner_address_is_refused_by_default(
    monkeypatch: pytest.MonkeyPatch, answering: None
) -> None:
    """Review of issue 14 (DNS rebinding under the default): a tenant's name resolved to a
    public address when the control API checked it and to an inner one when a service
    connects. Private addresses are allowed (the default), but only under names nobody on
    the internet can answer for; this one is refused at the services' resolver, in the
    task-list fetch and when named again."""

    for inner in ("10.0.0.1", "127.0.0.1", "192.168.1.20", "::1", "::ffff:10.0.0.1"):
        with pytest.raises(EnvironmentAddressError, match="DNS rebinding"):
            await _Answers("93.184.216.34", inner).resolve("env.example.com", 80)
        # the same answer for an inner name is the operator's server
        await _Answers(inner).resolve("envs.internal", 80)
        await _Answers(inner).resolve("pantry", 80)
    public = await _Answers("93.184.216.34").resolve("env.example.com", 80)
    assert [r["host"] for r in public] == ["93.184.216.34"]

    real = socket.getaddrinfo

    def inner_answer(host: str, *args: Any, **kwargs: Any) -> Any:
        if host != "env.example.com":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 80))]

    monkeypatch.setattr(socket, "getaddrinfo", inner_answer)
    with pytest.raises(EnvironmentAddressError, match="DNS rebinding"):
        check_resolved("env.example.com", 80)
    # the operator naming it (private allowed) is told at once, not at the first call
    why = await tenant_url_refusal("http://env.example.com/", private_allowed=True)
    assert why is not None and "RETRACE_ENVIRONMENTS_PRIVATE_HOSTS" in why


async def test_an_inner_server_behind_a_public_name_is_reached_once_listed(
    answering: None, operator_hosts: None
) -> None:
    allow_private(True)
    with pytest.raises(EnvironmentAddressError, match="DNS rebinding"):
        await _Answers("10.1.2.3").resolve("envs.mycorp.com", 80)
    allow_private(True, ["envs.mycorp.com"])
    assert [r["host"] for r in await _Answers("10.1.2.3").resolve("envs.mycorp.com", 80)] == [
        "10.1.2.3"
    ]
    with pytest.raises(EnvironmentAddressError, match="metadata"):  # never, listed or not
        await _Answers("169.254.169.254").resolve("envs.mycorp.com", 80)


def test_the_listed_names_are_read_as_every_service_and_the_cli_read_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shared.cli.context import load_settings

    cfg = load_config(
        ServiceConfig, env={"RETRACE_ENVIRONMENTS_PRIVATE_HOSTS": "envs.mycorp.com, *.corp.example"}
    )
    assert cfg.environments.private_hosts == ["envs.mycorp.com", "*.corp.example"]
    assert load_config(ServiceConfig, env={}).environments.private_hosts == []
    monkeypatch.setenv("RETRACE_ENVIRONMENTS_PRIVATE_HOSTS", "envs.mycorp.com")
    try:
        load_settings()  # every CLI command that reads the settings
        assert inner_name("envs.mycorp.com")
    finally:
        allow_private(True)
    assert not inner_name("envs.mycorp.com")


def test_a_host_name_with_a_percent_sign_is_refused() -> None:
    with pytest.raises(EnvironmentAddressError, match="no '%'"):
        checked_url("http://127.0.0.1%25x.attacker.com:8080/")
    assert checked_url("http://[fd12::1]:8600/") == "http://[fd12::1]:8600/"


def test_the_task_list_fetch_asks_the_name_the_resolver_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: `attacker。com` passed `inner_name` as one label while getaddrinfo asked
    attacker.com, whose owner answered 127.0.0.1: the task-list fetch read an inner page."""
    real = socket.getaddrinfo

    def owned(host: str, *args: Any, **kwargs: Any) -> Any:
        if host.encode("idna").lower().rstrip(b".") != b"attacker.com":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))]

    monkeypatch.setattr(socket, "getaddrinfo", owned)
    for spelled in ("attacker.com", "attacker\u3002com", "ATTACKER\uff0eCOM."):
        with pytest.raises(EnvironmentAddressError, match="DNS rebinding"):
            check_resolved(spelled, 80)
