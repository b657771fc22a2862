"""Windowed counters for the `limits` library's strategies (fixed window,
moving window, sliding window counter), kept in the kernel's C tables by
``fastlimit._windows.WindowStore``:

    commands.py    CL.FIXED, CL.MOVING, CL.SLIDING, CL.WINCLEAR, CL.WINFLUSH
    subsystem.py   the store's owner: FLUSHALL, the sweep, INFO

The client side (a ``limits`` storage speaking these commands) is
``fastlimit.limits_storage``.
"""
