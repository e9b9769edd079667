"""The model gate as its tests configure it: the keys callers and the engine hold, and a gate
in front of an engine at `upstream` with adapters from `store`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.serving.gate import GateConfig

SERVICE_KEY = "service-key"
ADMIN_KEY = "admin-key"
ENGINE_KEY = "engine-key"
"""The engine's own key, which only the gate holds."""
SERVICE = {"Authorization": f"Bearer {SERVICE_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def gate_config(upstream: str, store: Path, **extra: Any) -> GateConfig:
    return GateConfig(
        upstream=upstream,
        upstream_key=ENGINE_KEY,
        api_key=SERVICE_KEY,
        admin_key=ADMIN_KEY,
        adapter_dirs=(store,),
        **extra,
    )
