"""fastlimit as a storage for the `limits` library (and so for slowapi and
Flask-Limiter): importing this module registers its URI schemes.

    import fastlimit.limits_storage          # before the Limiter is built
    Limiter(key_func, storage_uri="fastlimit://localhost:6380")

Schemes, after limits' Redis storages:

    fastlimit://[user:password@]host[:port][/0]      (port defaults to 6380)
    fastlimits://...                                 TLS (as rediss://)
    fastlimit+unix:///path/to/socket
    fastlimit+cluster://host:port[,host:port...]     a fastlimit cluster
    fastlimit+sentinel://host:port[,...]/service     a primary Sentinel watches
    async+<any of these>                             the asyncio storages

limits registers storages by a metaclass when their class is defined and
looks up no entry points, so this import is what makes the schemes known.

Every strategy limits offers is served by a fastlimit command decided in C
at the server's clock (fastlimit/windows/): the fixed window by CL.FIXED,
the moving window by CL.MOVING, the sliding window counter by CL.SLIDING;
each strategy call (hit, test, get_window_stats, clear) is one round trip.
"""

from fastlimit.limits_storage.aio import (
    AsyncFastlimitClusterStorage,
    AsyncFastlimitSentinelStorage,
    AsyncFastlimitStorage,
)
from fastlimit.limits_storage.sync import (
    FastlimitClusterStorage,
    FastlimitSentinelStorage,
    FastlimitStorage,
)

__all__ = ["AsyncFastlimitClusterStorage", "AsyncFastlimitSentinelStorage",
           "AsyncFastlimitStorage", "FastlimitClusterStorage", "FastlimitSentinelStorage",
           "FastlimitStorage"]
