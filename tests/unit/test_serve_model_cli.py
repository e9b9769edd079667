"""`retrace serve-model` refuses an address others reach without a key (issue 14: the model
server served every tenant's adapters to whoever reached its port)."""

from __future__ import annotations

from pathlib import Path

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


def test_a_key_file_is_a_key_on_an_address_others_reach_and_is_checked_before_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file counts as a key; an unusable one stops serve-model at once with the
    line at fault, not after minutes of loading the model (and not echoing the line)."""
    monkeypatch.delenv("RETRACE_MODEL_API_KEY", raising=False)
    keys = tmp_path / "keys"
    keys.write_text("# the services' keys\ntoo-short\n")
    loaded: list[str] = []
    monkeypatch.setattr("shared.serving.server.load", lambda cfg: loaded.append(cfg.model))
    for flag in ("--api-key-file", "--admin-key-file"):
        keyed = [] if flag == "--api-key-file" else ["--api-key", "k" * 24]
        result = CliRunner().invoke(serve_model, ["--host", "0.0.0.0", *keyed, flag, str(keys)])
        assert result.exit_code == 1, result.output
        assert f"{keys}, line 2: a key needs at least 16 characters" in result.output
        assert "too-short" not in result.output
    assert loaded == []
