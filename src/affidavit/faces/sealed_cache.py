"""Answers about sealed jobs, computed once per process and served again.

Nothing may change a sealed job: its trace, its verification and its proof pack are the same
every time they are computed, so a server computes each once and keeps the bytes it sent. An
answer is kept under the job's id *and the hash of its seal* (plus whatever else the answer
depends on, such as the keys a verification accepts): a seal replaced in the database is
another key, never the old answer.

What this cannot see is a store changed behind a seal it still holds (events or ledger rows
edited with SQL): that is what ``?fresh=1`` and ``affidavit verify`` are for, which always
recompute. So a kept answer never claims to be current: it carries the time it was computed
(``computed_at``) and says that it was served from here (``cached``).

The cache lives in the server's memory, not in a table: an answer read from the database would
be one more row that whoever can write the database could forge (a verdict of ``ok`` the store
never earned), and the first read in each process would be a database read anyway. It is
bounded in bytes (least recently used first out); an answer larger than a tenth of the budget is
not kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_SEALED_CACHE_BYTES = 64 * 1024 * 1024

CacheKey = tuple[str, ...]


@dataclass(frozen=True)
class SealedAnswer:
    """One computed answer: the response body (``body``; for JSON, the document without its
    ``cached`` and ``computed_at`` members), the headers it was sent with and when it was
    computed (RFC 3339, UTC)."""

    body: bytes
    computed_at: str
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + 256


class SealedCache:
    """A thread-safe LRU of :class:`SealedAnswer` by key, at most ``max_bytes`` in all
    (``0``: keeps nothing). The caller makes the key: the kind of answer, the job id, the seal's
    hash and every other input the answer depends on."""

    def __init__(self, max_bytes: int = DEFAULT_SEALED_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 or more")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, SealedAnswer] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: CacheKey) -> SealedAnswer | None:
        """The answer kept under ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found

    def put(self, key: CacheKey, answer: SealedAnswer) -> bool:
        """Keep ``answer`` under ``key`` (replacing what was there), dropping the least recently
        used answers beyond the budget; ``False`` when it is too large to keep."""
        size = answer.size
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if size * 10 > self.max_bytes:
                return False
            self._entries[key] = answer
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.size
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return self._bytes
