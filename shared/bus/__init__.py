"""The NATS JetStream bus: streams, publishing, at-least-once delivery with exactly-once effects."""

from shared.bus.nats_bus import NatsBus

__all__ = ["NatsBus"]
