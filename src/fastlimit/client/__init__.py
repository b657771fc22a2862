"""Python clients for fastlimit servers: ``Client`` (sync) and
``AsyncClient`` (asyncio), on redis-py with hiredis.

Both answer every call with a ``Decision`` and never raise for a failing
server: with short timeouts (5 ms by default) a failed round trip becomes a
decision by policy, and a circuit breaker per server stops later calls from
paying the timeout at all while the server is down:

- a ``LocalFallback``, when configured, enforces a stricter limit in this
  process (source ``"local_fallback"``);
- otherwise ``on_failure="open"`` allows (source ``"failed_open"``, for
  product limits) and ``on_failure="closed"`` denies (``"failed_closed"``,
  for security limits: login, password reset, SMS).

Every such decision is counted in ``client.stats`` and logged at ERROR on
the ``fastlimit.client`` logger, at most once per second with the counts
since the previous line, so an outage cannot flood the log.

With several servers, keys are spread by consistent hashing: one key (the
client key, for ``limit``) always goes to the same server, and adding a
server moves about 1/N of the keys.

With ``sentinels=[...]`` and ``service="name"`` (or several names, hashed
the same way), the client asks Redis Sentinel where each service's
primary is and follows it through failovers (see ``failover.py``).

With ``cluster=[...]`` (startup nodes of a fastlimit or Redis Cluster),
keys go where the cluster's slot map says, and ``-MOVED`` replies are
followed (see ``cluster/client.py``); the breaker and the failure policy
are per primary, so one dead shard leaves the others' keys answered.

Modules:

- base: what both share: options, ``Stats``, the failure log, routing
  (ring, slot map), the requests and their outcomes (reply, fallback,
  failure policy);
- sync: ``Client``;
- aio: ``AsyncClient``;
- pipeline: the async client's automatic pipelining and its loop-time
  budget;
- prefetch: pre-aggregation's tokens held in this process.

Compiled parts it uses: none of its own; ``LocalFallback`` and
``Decision`` stand on _core.pyx, the slot map's hashing on _cluster.pyx
(``cluster/client.py``), and redis-py with hiredis does the wire.
"""

# __all__, and by name ("X as X") what fastlimit.client offered beside it
# when it was one module (tests/test_client.py imports _LoopTimeBudget).
from fastlimit.client.aio import AsyncClient
from fastlimit.client.base import DEFAULT_BREAKER as DEFAULT_BREAKER
from fastlimit.client.base import DEFAULT_SENTINEL_TIMEOUT_MS as DEFAULT_SENTINEL_TIMEOUT_MS
from fastlimit.client.base import DEFAULT_SERVER as DEFAULT_SERVER
from fastlimit.client.base import DEFAULT_TIMEOUT_MS as DEFAULT_TIMEOUT_MS
from fastlimit.client.base import FAILED_RETRY_MS as FAILED_RETRY_MS
from fastlimit.client.base import FAILURE_LOG_INTERVAL_S as FAILURE_LOG_INTERVAL_S
from fastlimit.client.base import UNKNOWN_LIMIT as UNKNOWN_LIMIT
from fastlimit.client.base import CircuitBreaker, ClusterMapError, Decision, LocalFallback, Stats
from fastlimit.client.base import Servers as Servers
from fastlimit.client.base import check_command as check_command
from fastlimit.client.base import log as log
from fastlimit.client.pipeline import _LoopTimeBudget as _LoopTimeBudget
from fastlimit.client.sync import Client

__all__ = ["AsyncClient", "CircuitBreaker", "Client", "ClusterMapError", "Decision",
           "LocalFallback", "Stats"]
