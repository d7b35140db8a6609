"""Capturing a command's output: every byte hashed and counted, a bounded head and tail kept.

A flood of output costs memory bounded by the cap, and the evidence still pins the whole stream
by its SHA-256 and length. Keeping the tail (not only the head) matters: pytest's summary,
coverage's total and JSON metrics are on the last lines.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Captured:
    """One output stream: its full size and digest, and the kept head and tail."""

    total_bytes: int
    sha256: str
    head: bytes
    tail: bytes

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self.head) + len(self.tail)

    def segments(self) -> list[str]:
        """The kept text: one segment when complete, head and tail when truncated. Invalid
        UTF-8 is replaced with U+FFFD."""
        if not self.truncated:
            return [(self.head + self.tail).decode("utf-8", errors="replace")]
        return [
            self.head.decode("utf-8", errors="replace"),
            self.tail.decode("utf-8", errors="replace"),
        ]

    def excerpt(self, limit: int) -> str:
        """At most ``limit`` bytes of the stream for the evidence record: all of it, or its
        beginning and end around a marker saying how many bytes were left out."""
        if not self.truncated and self.total_bytes <= limit:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        first = self.head[: limit - limit // 2]
        last = self.tail[max(0, len(self.tail) - limit // 2) :] if limit // 2 else b""
        omitted = self.total_bytes - len(first) - len(last)
        return (
            first.decode("utf-8", errors="replace")
            + f"\n…[{omitted} bytes omitted]…\n"
            + last.decode("utf-8", errors="replace")
        )

    def to_dict(self, excerpt_bytes: int) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "bytes": self.total_bytes,
            "truncated": self.truncated,
            "excerpt": self.excerpt(excerpt_bytes),
        }


class Capture:
    """Accumulates a stream: every byte is hashed; the first ``cap - cap//2`` and the last
    ``cap//2`` bytes are kept."""

    def __init__(self, cap: int) -> None:
        self._head_cap = cap - cap // 2
        self._tail_cap = cap // 2
        self._head = bytearray()
        self._tail = bytearray()
        self._digest = hashlib.sha256()
        self._total = 0

    def feed(self, chunk: bytes) -> None:
        self._digest.update(chunk)
        self._total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > 2 * self._tail_cap:  # trim in amortized O(1)
                del self._tail[: len(self._tail) - self._tail_cap]

    def result(self) -> Captured:
        tail = bytes(self._tail[-self._tail_cap :]) if self._tail_cap else b""
        return Captured(self._total, self._digest.hexdigest(), bytes(self._head), tail)
