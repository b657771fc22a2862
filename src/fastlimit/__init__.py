"""fastlimit: a rate-limiting counter server that speaks the Redis protocol.

The public names are imported when first used (PEP 562), so the server,
which needs none of the client's redis-py, starts without importing it:
the test suite starts thousands of servers."""

from importlib import import_module

__version__ = "0.1.0"

_HOMES = {"AsyncClient": "fastlimit.client", "Client": "fastlimit.client",
          "BucketStore": "fastlimit._core", "Clock": "fastlimit._core",
          "CircuitBreaker": "fastlimit.breaker", "Decision": "fastlimit.decision",
          "Limiter": "fastlimit.embedded", "LocalFallback": "fastlimit.embedded"}

__all__ = sorted(_HOMES) + ["__version__"]


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fastlimit' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
