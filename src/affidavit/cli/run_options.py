"""The options and settings the commands that submit and run jobs share (``run``, ``submit``,
``worker``, ``serve``, ``demo``, ``db clock``): each with its environment variable and
default, checked before anything is opened."""

from __future__ import annotations

import math
import os
from enum import StrEnum
from typing import Annotated, Any

import typer

from affidavit.cli.common import state
from affidavit.core.canonical import loads_unique
from affidavit.core.config import DEFAULT_LEASE_SECONDS, DEFAULT_MAX_RECOVERIES
from affidavit.core.errors import ConfigError
from affidavit.core.inputs import read_limited_text

ToolsOption = Annotated[
    list[str] | None,
    typer.Option(
        "--tools",
        help="Module (dotted name) or .py file that registers tools; repeatable.",
        show_default=False,
    ),
]
MIN_LEASE_SECONDS = 0.1


def lease_option(what: str, default: float) -> Any:
    """The ``--lease-seconds`` option: ``what`` the lease is, and its default."""
    return typer.Option(
        "--lease-seconds",
        min=MIN_LEASE_SECONDS,
        help=f"{what} (default $AFFIDAVIT_LEASE_SECONDS, else {default:g}).",
        show_default=False,
    )


LeaseOption = Annotated[
    float | None, lease_option("How long a claim lasts without a heartbeat", DEFAULT_LEASE_SECONDS)
]
StoreRetryOption = Annotated[
    float | None,
    typer.Option(
        "--store-retry-seconds",
        min=0,
        help="How long a run keeps trying a write while the database is unavailable (a "
        "restart, a failover, a busy lock) before it leaves the job to be reclaimed (default "
        "$AFFIDAVIT_STORE_RETRY_SECONDS, else 60).",
        show_default=False,
    ),
]

MaxOutageOption = Annotated[
    float | None,
    typer.Option(
        "--max-outage-seconds",
        min=0,
        help="Give up (exit 3) once the database has been unavailable this long in a row: every "
        "claim failing, or every run giving up (default $AFFIDAVIT_MAX_OUTAGE_SECONDS, else "
        "wait until it is back).",
        show_default=False,
    ),
]

MaxRecoveriesOption = Annotated[
    int | None,
    typer.Option(
        "--max-recoveries",
        min=0,
        help="Recoveries in a row of a job whose runs ended without handing it back or "
        "recording a step's outcome (a step that kills its worker) before it is parked as "
        "crash_loop instead of run again (default $AFFIDAVIT_MAX_RECOVERIES, else 5).",
        show_default=False,
    ),
]


class ReplayMode(StrEnum):
    strict = "strict"
    warn = "warn"
    human = "human"


ReplayVerificationOption = Annotated[
    ReplayMode | None,
    typer.Option(
        "--replay-verification",
        help="What a recorded side effect the world no longer matches does on pickup: strict "
        "(fail the job), warn (record and go on), human (park). Default: the plan's, else "
        "strict.",
        show_default=False,
    ),
]
StepConcurrencyOption = Annotated[
    int,
    typer.Option(
        "--step-concurrency",
        min=1,
        max=64,
        help="Independent nodes of one job run at once (their tools overlap; every step keeps "
        "its T1/T2 protocol).",
    ),
]
InputOption = Annotated[
    str | None,
    typer.Option("--input", help="Job input: a JSON object, or @file.json.", show_default=False),
]


def seconds_setting(value: float | None, env: str, default: float, *, zero_ok: bool) -> float:
    """``value`` if given, else the environment variable ``env``, else ``default``."""
    if value is not None:
        return value
    text = os.environ.get(env)
    if text:
        try:
            parsed = float(text)
        except ValueError:
            raise ConfigError(f"{env}={text!r} is not a number") from None
        if parsed < 0 or (parsed == 0 and not zero_ok) or parsed != parsed:
            raise ConfigError(f"{env} must be {'≥ 0' if zero_ok else 'positive'}")
        return parsed
    return default


def lease_seconds(value: float | None) -> float:
    lease = seconds_setting(value, "AFFIDAVIT_LEASE_SECONDS", DEFAULT_LEASE_SECONDS, zero_ok=False)
    if not math.isfinite(lease):  # a claim that never expires would hold a dead worker's job
        raise ConfigError("the lease must be a finite number of seconds", hint="The default is 15.")
    if lease < MIN_LEASE_SECONDS:  # the bound --lease-seconds has, for the environment too
        raise ConfigError(
            f"the lease must be at least {MIN_LEASE_SECONDS} seconds, not {lease}",
            hint="The default is 15.",
        )
    return lease


def max_recoveries(value: int | None) -> int:
    """``value`` if given, else ``$AFFIDAVIT_MAX_RECOVERIES``, else the default (5)."""
    if value is not None:
        return value
    text = os.environ.get("AFFIDAVIT_MAX_RECOVERIES")
    if not text:
        return DEFAULT_MAX_RECOVERIES
    try:
        parsed = int(text)
    except ValueError:
        raise ConfigError(f"AFFIDAVIT_MAX_RECOVERIES={text!r} is not a whole number") from None
    if parsed < 0:
        raise ConfigError("AFFIDAVIT_MAX_RECOVERIES must be ≥ 0")
    return parsed


def parse_json_arg(text: str | None, what: str) -> Any:
    """A JSON value from ``text`` or, with a leading ``@``, from that file (an object giving
    a key twice is refused, as in plan files)."""
    if text is None:
        return None
    if text.startswith("@"):
        try:
            text = read_limited_text(text[1:], f"{what} file", limit=state.max_input_bytes)
        except OSError as exc:
            raise ConfigError(f"cannot read {what} file {text[1:]!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{what} file {text[1:]!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
            ) from exc
    try:
        return loads_unique(text)
    except ValueError as exc:  # not JSON, or a key given twice
        raise ConfigError(f"{what} is not valid JSON: {exc}") from exc


AgentOption = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="Run the agent registered under this name (by @affidavit.agent in a --tools "
        "module) instead of a plan; --input holds its keyword arguments.",
        show_default=False,
    ),
]
