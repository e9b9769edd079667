"""`/metrics` without a metrics key answers this machine only (issue 14: the router's public
port listed tenants' adapter names to anyone); with a key, whoever carries it."""

from __future__ import annotations

from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from hypothesis import given
from hypothesis import strategies as st

from shared.runtime.http import Health, _local, build_app
from shared.runtime.metrics import ServiceMetrics


async def _health() -> Health:
    return Health(
        service="t", status="ok", nats=None, database=True, in_flight=0, consumers=[],
        uptime_s=0.0, pid=1,
    )  # fmt: skip


def _app(key: str | None) -> web.Application:
    return build_app(ServiceMetrics("metrics_access_test"), _health, metrics_key=key)


@pytest.mark.parametrize(
    ("remote", "local"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        (None, True),  # a Unix socket
        ("10.0.0.7", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.7", False),
        ("fe80::1%eth0", False),
        ("2001:db8::1", False),
        ("not an address", False),
    ],
)
def test_only_loopback_peers_are_this_machine(remote: str | None, local: bool) -> None:
    assert _local(remote) is local


@given(st.ip_addresses())
def test_any_address_is_judged_by_its_loopback_flag(address: object) -> None:
    assert _local(str(address)) is (getattr(address, "ipv4_mapped", None) or address).is_loopback  # type: ignore[union-attr]


async def _get_metrics(app: web.Application, peer: str, key: str | None = None) -> web.Response:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (peer, 40000) if name == "peername" else default
    )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    request = make_mocked_request("GET", "/metrics", headers=headers, app=app, transport=transport)
    match = await app.router.resolve(request)
    return await match.handler(request)  # type: ignore[return-value]


async def test_without_a_key_another_machine_is_refused_and_told_why() -> None:
    resp = await _get_metrics(_app(None), "10.0.0.7")
    assert resp.status == 403 and b"RETRACE_HTTP_METRICS_KEY" in bytes(resp.body)  # type: ignore[arg-type]
    assert (await _get_metrics(_app(None), "127.0.0.1")).status == 200


async def test_with_a_key_anyone_carrying_it_reads_them() -> None:
    app = _app("s3cret")
    assert (await _get_metrics(app, "10.0.0.7", "s3cret")).status == 200
    assert (await _get_metrics(app, "10.0.0.7")).status == 401
    assert (await _get_metrics(app, "127.0.0.1")).status == 401  # the key holds here too


async def test_a_real_loopback_client_reads_them_without_a_key() -> None:
    async with TestClient(TestServer(_app(None))) as c:
        resp = await c.get("/metrics")
        assert resp.status == 200 and "metrics_access_test" in await resp.text()
