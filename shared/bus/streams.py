"""Stream topology, derived from the registered contracts.

<SP>_EVENTS  limits retention: every consumer that filters a subject sees each message
<SP>_WORK    work-queue retention: each message is taken by exactly one worker
<SP>_DLQ     dead letters: `<prefix>_dlq.<tenant>.<stage>.<event>`, kept for inspection
"""

from __future__ import annotations

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from shared.config import NatsConfig
from shared.messages import Contract, contracts

DAY = 86_400.0


def stream_name(cfg: NatsConfig, kind: str) -> str:
    return f"{cfg.stream_prefix}_{kind.upper()}"


def contract_subject(cfg: NatsConfig, contract: type[Contract]) -> str:
    """The wildcard subject of a contract across tenants."""
    return f"{cfg.subject_prefix}.*.{contract.STAGE}.{contract.EVENT}"


def stream_for(cfg: NatsConfig, contract: type[Contract]) -> str:
    return stream_name(cfg, contract.STREAM)


def stream_configs(cfg: NatsConfig) -> list[StreamConfig]:
    by_kind: dict[str, list[str]] = {"events": [], "work": []}
    for contract in contracts():
        by_kind[contract.STREAM].append(contract_subject(cfg, contract))
    return [
        StreamConfig(
            name=stream_name(cfg, "events"),
            subjects=sorted(by_kind["events"]),
            retention=RetentionPolicy.LIMITS,
            max_age=cfg.max_age_days * DAY,
            storage=StorageType.FILE,
            duplicate_window=cfg.duplicate_window,
        ),
        StreamConfig(
            name=stream_name(cfg, "work"),
            subjects=sorted(by_kind["work"]),
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            duplicate_window=cfg.duplicate_window,
        ),
        StreamConfig(
            name=stream_name(cfg, "dlq"),
            subjects=[f"{cfg.subject_prefix}_dlq.>"],
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_age=30 * DAY,
            storage=StorageType.FILE,
            duplicate_window=cfg.duplicate_window,
        ),
    ]
