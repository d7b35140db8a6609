"""``affidavit worker --processes N``: N worker processes under one supervisor, so that one
host uses all its cores (a worker's Python runs its jobs' code under one interpreter lock).

Each child is an ordinary ``affidavit worker`` with the supervisor's options; the jobs are
shared through the database exactly as between workers on different hosts (claims, leases,
queue limits), so nothing about the guarantees changes. The supervisor:

- forwards SIGINT and SIGTERM: the first asks every child to stop gracefully (each lets its
  running steps record their outcomes and hands its jobs back), a second stops them at once;
- restarts a child that died (killed, crashed) after :data:`RESTART_DELAY` seconds; the dead
  child's jobs are recovered when their leases expire, as after any crash. More than
  :data:`CRASHES_PER_PROCESS` crashes per process within :data:`CRASH_WINDOW` seconds, or a
  child's exit 3 (a usage or store error, e.g. the database unavailable past
  ``--max-outage-seconds``), stops all of them and exits 3;
- with ``--until-idle``, ends when every child has found nothing left to run;
- with ``--metrics-port``, serves the sum of its children's counters (each child serves its
  own on a loopback port of its own) and ``affidavit_worker_restarts_total``. A restarted
  child's counters start again from zero (Prometheus reads a drop as a counter reset);
- adds up the jobs its children ran (a child that died cannot say: its runs are not counted).

A child watches its supervisor: if the supervisor dies, the child stops gracefully.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal as signals
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from affidavit.cli import output

RESTART_DELAY = 0.5
CRASHES_PER_PROCESS = 5
CRASH_WINDOW = 60.0
SCRAPE_TIMEOUT = 2.0
_POLL = 0.05


@dataclass
class _Child:
    """One slot of the supervisor: the process in it now, where it reports, how it ended."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    report: Path | None = None
    metrics_port: int | None = None
    restart_at: float | None = None
    done: bool = False


@dataclass
class Outcome:
    """What the supervisor ends with: its exit code, the jobs its children ran, restarts."""

    exit_code: int = 0
    jobs_run: int = 0
    restarts: int = 0
    crashes: list[float] = field(default_factory=list)


class Supervisor:
    """Run ``processes`` copies of ``affidavit worker ARGS`` (see the module's text)."""

    def __init__(
        self,
        args: list[str],
        processes: int,
        *,
        until_idle: bool,
        quiet: bool,
        metrics: bool,
    ) -> None:
        self._args = args
        self._until_idle = until_idle
        self._quiet = quiet
        self._metrics = metrics
        self._children = [_Child(i) for i in range(processes)]
        self._outcome = Outcome()
        self._stopping = 0  # signals seen
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="affidavit-workers-"))

    @property
    def restarts(self) -> int:
        return self._outcome.restarts

    def run(self) -> Outcome:
        """Start the children and supervise them until they are done or stopped."""
        previous = self._install_signals()
        try:
            for child in self._children:
                self._start(child)
            while not all(c.done for c in self._children):
                self._step(time.monotonic())
                time.sleep(_POLL)
        finally:
            self._kill_all(signals.SIGKILL)  # (none is left unless something raised)
            self._restore_signals(previous)
            for report in self._dir.iterdir():
                report.unlink()
            self._dir.rmdir()
        return self._outcome

    def _step(self, now: float) -> None:
        for child in self._children:
            if child.done:
                continue
            if child.proc is None:
                if self._stopping:
                    child.done = True
                elif child.restart_at is not None and now >= child.restart_at:
                    self._start(child)
                    self._outcome.restarts += 1
                continue
            code = child.proc.poll()
            if code is not None:
                self._ended(child, code, now)

    def _ended(self, child: _Child, code: int, now: float) -> None:
        self._collect(child)
        child.proc = None
        if self._stopping or (code == 0 and self._until_idle):
            child.done = True
            return
        if code == 3:
            self._fail(f"worker process {child.index} exited 3 (a usage or store error)")
            return
        crashes = [t for t in self._outcome.crashes if now - t < CRASH_WINDOW] + [now]
        self._outcome.crashes = crashes
        if len(crashes) > CRASHES_PER_PROCESS * len(self._children):
            self._fail(f"{len(crashes)} worker processes ended within {CRASH_WINDOW:g} s")
            return
        how = f"signal {-code}" if code < 0 else f"exit {code}"
        if not self._quiet:
            output.err.print(
                f"[yellow]worker process {child.index} ended ({how})[/]: starting another in "
                f"{RESTART_DELAY:g} s; its jobs are recovered when their leases expire",
                highlight=False,
            )
        child.restart_at = now + RESTART_DELAY

    def _fail(self, why: str) -> None:
        output.err.print(f"[red]error[/]: {why}: stopping every worker process", highlight=False)
        self._outcome.exit_code = 3
        self._stop(signals.SIGTERM)

    def _start(self, child: _Child) -> None:
        child.restart_at = None
        report = self._dir / f"{child.index}-{self._outcome.restarts}-{time.monotonic_ns()}"
        child.report = report
        argv = [*self._args, "--report-file", str(report)]
        if self._metrics:
            child.metrics_port = _free_port()
            argv += ["--metrics-port", str(child.metrics_port)]
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        child.proc = subprocess.Popen(
            [sys.executable, "-m", "affidavit", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            process_group=0,  # Ctrl-C reaches the supervisor only, which forwards it once
        )

    def _collect(self, child: _Child) -> None:
        if child.report is not None and child.report.exists():
            with contextlib.suppress(ValueError, KeyError, TypeError):  # (not a report)
                self._outcome.jobs_run += int(json.loads(child.report.read_text())["jobs_run"])

    def _stop(self, signum: int) -> None:
        self._stopping += 1
        self._kill_all(signum)

    def _kill_all(self, signum: int) -> None:
        for child in self._children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)
                if signum == signals.SIGKILL:
                    child.proc.wait()

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handle(signum: int, frame: FrameType | None) -> None:
            if self._stopping:
                self._stop(signals.SIGKILL)
                return
            if not self._quiet:
                name = signals.Signals(signum).name
                output.err.print(
                    f"{name}: stopping every worker process after its running steps "
                    "(signal again to stop at once)"
                )
            self._stop(signals.SIGTERM)

        return {s: signals.signal(s, handle) for s in (signals.SIGINT, signals.SIGTERM)}

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for s, h in previous.items():
            signals.signal(s, h)

    def metrics_ports(self) -> list[int]:
        """The loopback ports of the children running now."""
        return [
            c.metrics_port
            for c in self._children
            if c.proc is not None and c.metrics_port is not None and c.proc.poll() is None
        ]


SUPERVISOR_ENV = "AFFIDAVIT_WORKER_SUPERVISOR"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def write_report(path: Path, jobs_run: int) -> None:
    """A child's report to its supervisor (written last, atomically)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"jobs_run": jobs_run}))
    partial.replace(path)


def watch_supervisor(stop: Any) -> None:
    """In a supervised child: call ``stop()`` once, when the supervisor that started it is
    gone (the child is re-parented), so that no worker outlives its supervisor."""
    parent = os.environ.get(SUPERVISOR_ENV)
    if parent is None:
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(0.5)
        stop()

    threading.Thread(target=watch, name="affidavit-supervisor-watch", daemon=True).start()


def serve_summed_metrics(supervisor: Supervisor, port: int) -> None:
    """Serve, at ``http://127.0.0.1:PORT/metrics``, the sum of the children's samples (by name
    and labels) and the supervisor's restarts.

    Raises:
        OSError: the port cannot be listened on.
    """
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Summed(supervisor))
    start_http_server(port, addr="127.0.0.1", registry=registry)


class _Summed:
    """A Prometheus collector: each scrape reads every running child's ``/metrics``."""

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, Metric
        from prometheus_client.parser import text_string_to_metric_families

        families: dict[str, Metric] = {}
        sums: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        for port in self._supervisor.metrics_ports():
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
                    text = response.read(16 << 20).decode()
            except OSError:
                continue  # (a child starting, or just ended)
            for family in text_string_to_metric_families(text):
                families.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                    sums[key] = sums.get(key, 0.0) + sample.value
        for (family_name, sample_name, labels), value in sums.items():
            families[family_name].add_sample(sample_name, dict(labels), value)
        yield from families.values()
        restarts = CounterMetricFamily(
            "affidavit_worker_restarts",
            "Worker processes the supervisor started again after one ended.",
        )
        restarts.add_metric([], self._supervisor.restarts)
        yield restarts
