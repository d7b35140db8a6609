"""Counters a runtime keeps about itself, in Prometheus' text format.

One :class:`RuntimeMetrics` per :class:`~affidavit.runtime._runtime.Runtime` (no process-wide
state). Counting is a dictionary update under a lock; ``prometheus_client`` is imported only to
render the exposition text (``render()``, served at ``/metrics``), so a worker that is never
scraped does not pay for importing it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


class LabelledCounter:
    """A monotonically increasing counter per combination of label values."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> _Child:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}")
        return _Child(self, tuple(values))

    def inc(self, *values: str) -> None:
        """Add one to the counter of these label values (``labels(*values).inc()``, without
        the child object: steps count through here)."""
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}")
        with self._lock:
            self._values[values] = self._values.get(values, 0.0) + 1.0

    def _inc(self, key: tuple[str, ...], amount: float) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        key = tuple(labels.get(n, "") for n in self.labelnames)
        with self._lock:
            return self._values.get(key, 0.0)

    def samples(self) -> list[tuple[tuple[str, ...], float]]:
        with self._lock:
            return sorted(self._values.items())


class _Child:
    def __init__(self, counter: LabelledCounter, key: tuple[str, ...]) -> None:
        self._counter = counter
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self._counter._inc(self._key, amount)


class RuntimeMetrics:
    """The runtime's counters."""

    def __init__(self) -> None:
        self.confirmations = LabelledCounter(
            "affidavit_confirmations",
            "Recorded side effects checked against the world on pickup, by result.",
            ("result",),
        )
        self.confirmation_warnings = LabelledCounter(
            "affidavit_confirmation_warnings",
            "Mismatches recorded as confirmation_warning (replay_verification: warn).",
            ("resource_type",),
        )
        self.steps = LabelledCounter(
            "affidavit_steps",
            "Steps finished by this process, by node type and outcome (node_finished).",
            ("node_type", "result_type"),
        )
        self.ledger_decisions = LabelledCounter(
            "affidavit_ledger_decisions",
            "Invocation-ledger decisions at T1: allow_execute, return_recorded_result, in_flight.",
            ("decision",),
        )
        self.store_retries = LabelledCounter(
            "affidavit_store_retries",
            "Run writes that met an unavailable database, by outcome: retried (tried again), "
            "landed (a commit reported as failed had been written), gave_up.",
            ("outcome",),
        )
        self._counters = (
            self.confirmations,
            self.confirmation_warnings,
            self.steps,
            self.ledger_decisions,
            self.store_retries,
        )

    def value(self, name: str, **labels: str) -> float:
        """The current value of sample ``name`` (e.g. ``affidavit_confirmations_total``);
        0 when it has not been counted yet."""
        for counter in self._counters:
            if name in (counter.name, f"{counter.name}_total"):
                return counter.value(**labels)
        raise KeyError(name)

    def render(self) -> bytes:
        """The Prometheus text exposition of every counter."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry())

    def registry(self) -> Any:
        """A ``prometheus_client`` registry that reads these counters at each scrape."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily
        from prometheus_client.registry import Collector

        counters = self._counters

        class _Collector(Collector):
            def collect(self) -> Iterator[Any]:
                for c in counters:
                    family = CounterMetricFamily(c.name, c.documentation, labels=c.labelnames)
                    for key, value in c.samples():
                        family.add_metric(list(key), value)
                    yield family

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector())
        return registry

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` for Prometheus on ``host:port`` from a background thread."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry())
