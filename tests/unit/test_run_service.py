"""The process entry point every service's `__main__` runs (`shared.runtime.main`): the
settings it applies to the whole process before the service starts."""

from __future__ import annotations

from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from shared.config import ServiceConfig
from shared.envs.remote import address
from shared.runtime import main


@pytest.fixture
def restored() -> Iterator[None]:
    try:
        yield
    finally:
        address.allow_private(True)


@pytest.mark.parametrize(("given", "allowed"), [("false", False), ("true", True), (None, True)])
def test_a_service_process_reaches_environments_as_the_deployment_says(
    monkeypatch: pytest.MonkeyPatch, restored: None, given: str | None, allowed: bool
) -> None:
    """`RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED` is this process's policy for every connection
    to an environment, set before the service is built."""
    seen: list[bool] = []

    class Ran:
        async def run(self, freeze_start_up: bool = False) -> int:
            return 0

    def build(cfg: ServiceConfig) -> Any:
        seen.append(address._private_allowed)
        return Ran()

    def ran(work: Coroutine[Any, Any, int]) -> int:
        work.close()
        return 0

    address.allow_private(not allowed)  # the opposite, to see it change
    if given is None:
        monkeypatch.delenv("RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED", raising=False)
    else:
        monkeypatch.setenv("RETRACE_ENVIRONMENTS_PRIVATE_ALLOWED", given)
    monkeypatch.setattr(main.asyncio, "run", ran)
    monkeypatch.setattr(main, "configure_logging", lambda *a, **k: None)  # the worker's own
    with pytest.raises(SystemExit) as stopped:
        main.run_service("ping", ServiceConfig, build)
    assert stopped.value.code == 0
    assert seen == [allowed]
