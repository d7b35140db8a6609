"""What one pack verification carries from phase to phase, and the vocabulary of its verdicts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

MATCH, DIVERGE, INTEGRITY_FAIL = "MATCH", "DIVERGE", "INTEGRITY_FAIL"
EXIT_CODES = {MATCH: 0, DIVERGE: 1, INTEGRITY_FAIL: 2}
STATUSES = ("PASS", "FAIL", "SKIPPED")
FUTURE_SKEW = timedelta(hours=24)
HASH = re.compile(r"^sha256:[0-9a-f]{64}\Z")
HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
EPISODE = re.compile(r"^ep_[0-9a-f]{24}\Z")


class Fail(Exception):
    """A value is not what the pack format requires (caught per check)."""


@dataclass
class State:
    """The pack being verified and what the phases found so far: every error of a phase is
    collected in ``errors`` (the first phase with errors decides the verdict)."""

    root: Path
    max_file_bytes: int = 256 * 1024 * 1024  # the most a file of the pack may hold
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    contract: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    receipts: list[Any] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # rtype() of each receipt
    close: dict[str, Any] | None = None
    # the contract's hashes (phase 3 and the result receipt) and the JCS of its large parts,
    # computed once: the replay script of a 10,000-step job is a megabyte
    contract_hashes: dict[str, str | Fail] = field(default_factory=dict)
    contract_strict: bool = False  # orjson parsed the contract (no NaN, infinity)
    contract_jcs: dict[str, bytes | None] = field(default_factory=dict)


def payload(receipt: dict[str, Any]) -> dict[str, Any]:
    """A receipt's payload fields: its ``payload`` object when it nests one, else the receipt."""
    inner = receipt.get("payload")
    return inner if isinstance(inner, dict) else receipt


def rtype(receipt: Any) -> str:
    """A receipt's type (``type``, else ``receipt_type``); "" when it has none."""
    if not isinstance(receipt, dict):
        return ""
    value = receipt.get("type") or receipt.get("receipt_type") or ""
    return value if isinstance(value, str) else ""


def as_int(value: Any) -> int | None:
    """``value`` when it is an integer (not a bool), else None."""
    return value if type(value) is int else None


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 timestamp (UTC when it names no zone); None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
