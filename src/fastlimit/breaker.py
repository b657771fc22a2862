"""A circuit breaker, so that callers stop paying a timeout per request
while a server is down."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

CLOSED = "closed"
OPEN = "open"


class CircuitBreaker:
    """Opens after ``failures`` failed round trips within ``window_s``
    seconds.  While open, ``allow()`` refuses every call except one probe
    every ``probe_every_s`` seconds; any success closes it again.

    The client gives each server its own breaker with these settings (see
    ``copy``), so one server's outage never skips the others.  ``clock``
    (seconds, monotonic) is injectable for tests.
    """

    def __init__(self, failures: int = 5, window_s: float = 1.0,
                 probe_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        if failures < 1 or window_s <= 0 or probe_every_s <= 0:
            raise ValueError("failures >= 1, window_s > 0 and probe_every_s > 0")
        self.failures = failures
        self.window_s = window_s
        self.probe_every_s = probe_every_s
        self.clock = clock
        self.state = CLOSED
        self.opened_count = 0          # times it has opened, ever
        self._recent: deque[float] = deque()
        self._next_probe = 0.0
        self._lock = threading.Lock()

    def copy(self) -> CircuitBreaker:
        """A fresh, closed breaker with the same settings."""
        return CircuitBreaker(self.failures, self.window_s, self.probe_every_s, self.clock)

    @property
    def is_open(self) -> bool:
        """Whether calls skip the network (apart from the probes)."""
        return self.state == OPEN

    def allow(self) -> bool:
        """May this call use the network?  While open, the first caller
        after each probe interval is let through as the probe."""
        if self.state == CLOSED:
            return True
        with self._lock:
            if self.state == CLOSED:
                return True
            now = self.clock()
            if now >= self._next_probe:
                # Push the next probe out now, so concurrent callers do not
                # all probe a dead server at once.
                self._next_probe = now + self.probe_every_s
                return True
            return False

    def record_success(self) -> bool:
        """The server answered.  Returns True if that closed the breaker."""
        if self.state == CLOSED:
            return False
        with self._lock:
            was_open = self.state == OPEN
            self.state = CLOSED
            self._recent.clear()
            return was_open

    def record_failure(self) -> bool:
        """A round trip failed.  Returns True if that opened the breaker.
        Failures while open (a failed probe, stragglers) change nothing:
        the next probe is already scheduled."""
        with self._lock:
            if self.state == OPEN:
                return False
            now = self.clock()
            self._recent.append(now)
            while self._recent and self._recent[0] <= now - self.window_s:
                self._recent.popleft()
            if len(self._recent) < self.failures:
                return False
            self.state = OPEN
            self.opened_count += 1
            self._next_probe = now + self.probe_every_s
            return True

    def probe_now(self) -> None:
        """Lets the next call probe at once: what is behind this server's
        name has changed (a failover), so the last probe's failure says
        nothing about it."""
        with self._lock:
            self._next_probe = 0.0

    def seconds_until_probe(self) -> float:
        """How long until the next probe may go out; 0 unless open."""
        return max(0.0, self._next_probe - self.clock()) if self.state == OPEN else 0.0
