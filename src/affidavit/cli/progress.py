"""Progress on stderr while a command runs jobs: one line per step outcome, per job.

``affidavit run`` follows its job's log from a second thread while the job runs, and prints each
step's outcome as it is recorded (a long job shows where it is); ``affidavit worker`` prints one
line per job it ran. Both read only what is committed, never slow the run down beyond one read
of the new events every ``interval`` seconds, and print nothing with ``--json``.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any

from affidavit.cli.output import escape
from affidavit.core.errors import AffidavitError, ReplayError, StoreError
from affidavit.store import Store, StoredEvent

if TYPE_CHECKING:
    from rich.console import Console


# result type of node_finished -> (mark, colour, words)
_OUTCOMES = {
    "pure": ("✓", "green", "done"),
    "side_effect_committed": ("✓", "green", "committed"),
    "compensated": ("↺", "yellow", "compensated"),
    "retryable_failure": ("↻", "yellow", "failed (retryable)"),
    "compensatable_failure": ("✗", "red", "failed (compensatable)"),
    "permanent_failure": ("✗", "red", "failed"),
}


def describe(event: StoredEvent) -> str | None:
    """The progress line (Rich markup) for one event, or ``None`` for events not shown."""
    try:
        p: Any = event.payload
    except ReplayError:  # not JSON: nothing to show (verification reports it)
        return None
    if not isinstance(p, dict):
        return None
    node = escape(str(p.get("node_id", "")))
    if event.type == "node_finished":
        mark, colour, words = _OUTCOMES.get(
            str(p.get("result_type")), ("?", "yellow", str(p.get("result_type")))
        )
        line = f"  [{colour}]{mark}[/] {node} {escape(words)}"
        duration = p.get("duration_ms")
        if isinstance(duration, int | float) and not isinstance(duration, bool):
            line += f" [dim]({duration:,.0f} ms)[/]"
        error = p.get("error")
        if isinstance(error, dict) and error.get("message"):
            line += f": {escape(str(error['message']))}"
        return line
    if event.type == "tool_invocation_finished" and p.get("catch_up"):
        outcome = "the effect had happened" if p.get("outcome") == "success" else "it had not"
        return f"  [yellow]↺[/] {node} recovered an invocation left open: {outcome}"
    if event.type == "job_waiting":
        return f"  [yellow]…[/] {node} waits: {escape(str(p.get('reason', '')))}"
    if event.type == "job_parked":  # (the reason and why in words; the detail: `jobs show`)
        why = _park_words(p.get("detail"))
        line = f"  [yellow]‖[/] parked at {node}: {escape(str(p.get('reason', '')))}"
        return line + (f" ({escape(why[:200])})" if why else "")
    if event.type == "step_compensated":
        return f"  [yellow]↺[/] {node} compensation ran"
    return None


def _park_words(detail: Any) -> str:
    """What a park's detail says in words: the first mismatch's reason, or its message."""
    if isinstance(detail, str):
        return detail
    if not isinstance(detail, dict):
        return ""
    mismatches = detail.get("mismatches")
    if isinstance(mismatches, list) and mismatches and isinstance(mismatches[0], dict):
        return str(mismatches[0].get("reason", ""))
    for key in ("message", "error"):
        if isinstance(detail.get(key), str):
            return str(detail[key])
    return ""


class StepProgress:
    """Print the steps of one job as its run records them (a context manager around the run).

    The log is read from a thread of its own every ``interval`` seconds; leaving the context
    reads it once more, so every event recorded by then is printed, in version order, once.
    A read that fails (the database busy, say) is skipped: progress is never worth failing
    the run over.
    """

    def __init__(
        self,
        store: Store,
        job_id: str,
        console: Console,
        *,
        after_version: int = 0,
        interval: float = 0.25,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.console = console
        self.version = after_version
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="affidavit-progress", daemon=True)

    def __enter__(self) -> StepProgress:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _follow(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        """Print what was recorded since the last poll (one poller at a time: the thread,
        then, once it is joined, the final read)."""
        try:
            events = self.store.list_events(self.job_id, after_version=self.version)
        except (StoreError, AffidavitError):
            return
        for event in events:
            self.version = event.version
            line = describe(event)
            if line is not None:
                self.console.print(line, highlight=False)


def status_markup(status: str) -> str:
    """A job status (or ``lost``) coloured for the terminal: green done, red ended badly,
    yellow for what waits on something."""
    colour = {"completed": "green", "failed": "red", "cancelled": "red", "lost": "red"}.get(
        status, "yellow"
    )
    return f"[{colour}]{escape(status)}[/]"


def job_line(job_id: str, status: str, seconds: float) -> str:
    """The line ``affidavit worker`` prints after each run (Rich markup)."""
    return f"job {job_id}: {status_markup(status)} [dim]({seconds:,.2f} s)[/]"
