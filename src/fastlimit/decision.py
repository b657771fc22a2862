"""The answer to "may this key spend this much now?", whoever gave it."""

from __future__ import annotations

from fastlimit import _core

# Where a Decision came from.
SERVER = "server"                  # a fastlimit server (also tokens pre-fetched from it)
LOCAL = "local"                    # the embedded Limiter, in this process by design
LOCAL_FALLBACK = "local_fallback"  # the server is failing; a stricter local limit answered
FAILED_OPEN = "failed_open"        # the server is failing; allowed without checking
FAILED_CLOSED = "failed_closed"    # the server is failing; denied without checking

SOURCES = frozenset({SERVER, LOCAL, LOCAL_FALLBACK, FAILED_OPEN, FAILED_CLOSED})


# Decision lives in the Cython core, so the embedded limiter builds it in C.
Decision = _core.Decision
