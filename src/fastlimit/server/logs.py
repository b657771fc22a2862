"""Server logging: Redis's line format, and a bound on how fast any one
kind of line can grow the log.

Clients can cause log lines (a connection over its output limit, a
refused replica link, a primary that keeps refusing the handshake), and a
client can do that at network speed.  ``RepeatLimit`` lets each kind of
line (its format string, which comes from our code, never from a client)
through ``BURST`` times per ``WINDOW_S``; past that the lines are counted,
and one summary line says how many were left out when the window ends.
"""

from __future__ import annotations

import logging
import sys
import time

from fastlimit.server import config as cfg

BURST = 10          # lines of one kind per window, before they are counted instead
WINDOW_S = 60.0
MAX_KINDS = 1024    # distinct format strings tracked (they are our code's: few)


class RepeatLimit(logging.Filter):
    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S,
                 clock=time.monotonic):
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self.kinds: dict[str, list] = {}     # format -> [window start, lines, left out]
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        kind = self.kinds.get(record.msg)
        if kind is None:
            if len(self.kinds) >= MAX_KINDS:
                self.kinds.clear()
            kind = self.kinds[record.msg] = [now, 0, 0]
        if now - kind[0] >= self.window_s:
            if kind[2]:
                record.msg = (f"({kind[2]} more like the next line left out in the last "
                              f"{now - kind[0]:.0f} s) {record.msg}")
            kind[:] = [now, 0, 0]
        kind[1] += 1
        if kind[1] <= self.burst:
            return True
        kind[2] += 1
        self.suppressed_total += 1
        return False


REPEAT_LIMIT = RepeatLimit()


def setup_logging(level: str) -> None:
    logging.addLevelName(15, "VERBOSE")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(process)d:M %(asctime)s.%(msecs)03d %(levelname)s %(message)s",
        datefmt="%d %b %Y %H:%M:%S"))
    handler.addFilter(REPEAT_LIMIT)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.LOGLEVELS[level])
