"""fastlimit: a rate-limiting counter server that speaks the Redis protocol."""

__version__ = "0.1.0"

from fastlimit._core import BucketStore, Clock  # noqa: E402

__all__ = ["BucketStore", "Clock", "__version__"]
