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


async def test_a_name_that_resolves_to_metadata_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's name can point anywhere after the API checked it: the services' resolver
    refuses the answer itself."""

    async def answered(self: _Answers, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return await self._answer(host, port)

    monkeypatch.setattr("aiohttp.resolver.ThreadedResolver.resolve", answered)
    with pytest.raises(EnvironmentAddressError, match="metadata"):
        await _Answers("10.0.0.1", "169.254.169.254").resolve("env.example.com", 80)
    assert [r["host"] for r in await _Answers("10.0.0.1").resolve("env.example.com", 80)] == [
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
    monkeypatch: pytest.MonkeyPatch, public_only: None
) -> None:
    """Review of issue 14 (DNS rebinding): a tenant's name resolved to a public address when
    the control API checked it and to an inner one when a service connects. Where the
    deployment allows no private address (`RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED=false`), the
    services' resolver refuses that answer; the address written in the URL too."""

    async def answered(self: _Answers, host: str, port: int = 0, family: Any = 0) -> list[Any]:
        return await self._answer(host, port)

    monkeypatch.setattr("aiohttp.resolver.ThreadedResolver.resolve", answered)
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
