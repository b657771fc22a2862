"""Python clients for fastlimit servers: ``Client`` (sync) and
``AsyncClient`` (asyncio), on redis-py with hiredis (see base.py)."""

# The names the client module has always had; those outside __all__ are
# re-exported by name ("X as X").
from fastlimit.client.base import DEFAULT_BREAKER as DEFAULT_BREAKER
from fastlimit.client.base import DEFAULT_SENTINEL_TIMEOUT_MS as DEFAULT_SENTINEL_TIMEOUT_MS
from fastlimit.client.base import DEFAULT_SERVER as DEFAULT_SERVER
from fastlimit.client.base import DEFAULT_TIMEOUT_MS as DEFAULT_TIMEOUT_MS
from fastlimit.client.base import FAILED_RETRY_MS as FAILED_RETRY_MS
from fastlimit.client.base import FAILURE_LOG_INTERVAL_S as FAILURE_LOG_INTERVAL_S
from fastlimit.client.base import UNKNOWN_LIMIT as UNKNOWN_LIMIT
from fastlimit.client.base import (
    AsyncClient,
    CircuitBreaker,
    Client,
    ClusterMapError,
    Decision,
    LocalFallback,
    Stats,
)
from fastlimit.client.base import Servers as Servers
from fastlimit.client.base import _LoopTimeBudget as _LoopTimeBudget
from fastlimit.client.base import check_command as check_command
from fastlimit.client.base import log as log

__all__ = ["AsyncClient", "CircuitBreaker", "Client", "ClusterMapError", "Decision",
           "LocalFallback", "Stats"]
