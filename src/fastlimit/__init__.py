"""fastlimit: a rate-limiting counter server that speaks the Redis protocol."""

__version__ = "0.1.0"

from fastlimit._core import BucketStore, Clock  # noqa: E402
from fastlimit.breaker import CircuitBreaker  # noqa: E402
from fastlimit.client import AsyncClient, Client  # noqa: E402
from fastlimit.decision import Decision  # noqa: E402
from fastlimit.embedded import Limiter, LocalFallback  # noqa: E402

__all__ = ["AsyncClient", "BucketStore", "CircuitBreaker", "Client", "Clock", "Decision",
           "Limiter", "LocalFallback", "__version__"]
