"""Counters a runtime keeps about itself, in Prometheus' text format.

One :class:`RuntimeMetrics` per :class:`~affidavit.runtime.runtime.Runtime` (its own registry,
no process-wide state); ``render()`` gives the exposition text the HTTP API serves at
``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest


class RuntimeMetrics:
    """The runtime's counters."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.confirmations = Counter(
            "affidavit_confirmations",
            "Recorded side effects checked against the world on pickup, by result.",
            ["result"],
            registry=self.registry,
        )
        self.confirmation_warnings = Counter(
            "affidavit_confirmation_warnings",
            "Mismatches recorded as confirmation_warning (replay_verification: warn).",
            ["resource_type"],
            registry=self.registry,
        )

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample ``name`` (e.g. ``affidavit_confirmations_total``);
        0 when it has not been counted yet."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def render(self) -> bytes:
        """The Prometheus text exposition of every counter."""
        return generate_latest(self.registry)
