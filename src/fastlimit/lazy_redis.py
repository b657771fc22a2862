"""redis-py, loaded when first used.  The server needs it only in cluster
mode (calls to other nodes and to Sentinel, which share failover.py's
Sentinel event helpers with the client library), and importing it is a
third of a server's start: the test suite starts servers by the thousand.
``redis`` here is the package itself once touched; loading it loads its
submodules (asyncio, retry, backoff, exceptions) too."""

from __future__ import annotations

import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis as redis
    import redis.asyncio
    import redis.asyncio.client
    import redis.asyncio.retry
    import redis.backoff
    import redis.retry
else:
    def _lazy(name: str):
        module = sys.modules.get(name)
        if module is not None:
            return module
        spec = importlib.util.find_spec(name)
        loader = importlib.util.LazyLoader(spec.loader)
        spec.loader = loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        loader.exec_module(module)
        return module

    redis = _lazy("redis")
