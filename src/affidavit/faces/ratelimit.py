"""Per-key rate limiting: a token bucket per API key, in memory (per server process)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from affidavit.core.errors import AffidavitError, ConfigError


class RateLimited(AffidavitError):
    code = "rate_limited"
    default_hint = "Slow down; retry after the number of seconds in the Retry-After header."

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many requests; retry in {retry_after:.1f}s")
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class RateLimit:
    """``requests`` per ``seconds`` per key, with bursts up to ``requests``."""

    requests: int
    seconds: float

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"600/60"`` = 600 requests per 60 seconds.

        Raises:
            ConfigError: another form, or non-positive numbers.
        """
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)\s*s?\s*", text)
        if not match or int(match.group(1)) < 1 or float(match.group(2)) <= 0:
            raise ConfigError(
                f"invalid rate limit {text!r}",
                hint="Write REQUESTS/SECONDS, e.g. 600/60 (600 requests a minute per key).",
            )
        return cls(int(match.group(1)), float(match.group(2)))


# Per key, on the HTTP API and on ``affidavit mcp`` over HTTP.
DEFAULT_RATE_LIMIT = RateLimit(1200, 60.0)


class Limiter:
    """Token buckets by key; thread-safe."""

    def __init__(self, limit: RateLimit, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._rate = limit.requests / limit.seconds
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str) -> None:
        """Spend one token of ``key``'s bucket.

        Raises:
            RateLimited: the bucket is empty; ``retry_after`` says when a token is back.
        """
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.limit.requests), now))
            tokens = min(float(self.limit.requests), tokens + (now - at) * self._rate)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise RateLimited((1.0 - tokens) / self._rate)
            self._buckets[key] = (tokens - 1.0, now)
