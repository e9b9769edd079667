"""Prometheus metrics of a service, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"service": service}
        self.handled = Counter(
            "retrace_messages_total",
            "Messages handled, by contract and outcome",
            ["contract", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "retrace_handler_seconds",
            "Time to handle one message",
            ["contract"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 1800),
        )
        self.dead_lettered = Counter(
            "retrace_dead_lettered_total",
            "Messages sent to the dead-letter stream",
            ["contract", "kind"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "retrace_in_flight", "Messages being handled now", registry=self.registry
        )
        self.up = Gauge(
            "retrace_service_up",
            "1 while the service is healthy",
            list(labels),
            registry=self.registry,
        )
        self.up.labels(service).set(0)
        self.service = service

    def set_up(self, healthy: bool) -> None:
        self.up.labels(self.service).set(1 if healthy else 0)
