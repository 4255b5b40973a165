"""A token bucket: at most ``rate_per_s`` admissions per second on average, bursts up to ``burst``.

Used by the ingest API to shed load before reading a request body (429 with ``Retry-After``).
The clock is injected (monotonic seconds), so tests drive time by hand. ``rate_per_s <= 0``
means "no limit" and :meth:`TokenBucket.acquire` always admits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Thread-safe token bucket refilled continuously at ``rate_per_s`` tokens per second."""

    def __init__(
        self,
        rate_per_s: float,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s < 0 or (burst is not None and burst <= 0):
            raise ValueError("rate_per_s must be >= 0 and burst > 0")
        self.rate_per_s = float(rate_per_s)
        self.burst = float(burst) if burst is not None else max(1.0, self.rate_per_s)
        self._clock = clock
        self._tokens = self.burst
        self._updated = clock()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def acquire(self, tokens: float = 1.0) -> float:
        """Take ``tokens`` if available and return 0.0; else take nothing and return the
        seconds until they would be available (always > 0)."""
        if not self.enabled:
            return 0.0
        with self._lock:
            now = self._clock()
            elapsed = max(0.0, now - self._updated)
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate_per_s)
            self._updated = now
            if self._tokens >= tokens:
                self._tokens -= tokens
                return 0.0
            return (tokens - self._tokens) / self.rate_per_s

    @staticmethod
    def retry_after_s(wait_s: float) -> int:
        """``Retry-After`` header value (whole seconds, at least 1) for a wait of ``wait_s``."""
        return max(1, math.ceil(wait_s))
