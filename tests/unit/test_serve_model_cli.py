"""`retrace serve-model` refuses an address others reach without a key (issue 14: the model
server served every tenant's adapters to whoever reached its port)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from shared.cli.serve import serve_model
from shared.runtime.http import loopback


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "model.internal"])
def test_no_key_on_an_address_others_reach(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RETRACE_MODEL_API_KEY", raising=False)
    result = CliRunner().invoke(serve_model, ["--host", host])
    assert result.exit_code == 2 and "without a key" in result.output, result.output


@pytest.mark.parametrize(("host", "local"), [("127.0.0.1", True), ("::1", True),
                                             ("localhost", True), ("0.0.0.0", False)])  # fmt: skip
def test_loopback_addresses(host: str, local: bool) -> None:
    assert loopback(host) is local
