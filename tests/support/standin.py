"""A stand-in for the rls layer's decision, and a launcher that runs a
real fastlimit server with it.

The decision service (src/fastlimit/rls/service.py) comes with the "rls"
branch; until it is merged, the gRPC front's tests need something that
counts.  This is a test double with the seam's shape: one fixed window per
(domain, descriptor entries), windows aligned to the epoch on the server's
clock (the manual clock in tests), the limit picked by the descriptor's
first entry key (--standin-rule KEY=N/UNIT), else its `limit` override,
else 1000/minute.  Domain "boom" raises a plain exception (a bug in the
service), an empty domain or no descriptors raise RlsError as the
reference refuses them.

    python standin.py [--standin-rule KEY=N/UNIT]... <fastlimit-server args>
"""

from __future__ import annotations

import argparse
import sys

from fastlimit.server import config as cfg
from fastlimit.server.app import Server, new_event_loop
from fastlimit.server.grpc.listener import RlsError
from fastlimit.server.logs import setup_logging

UNITS = {"second": (1, 1), "minute": (60, 2), "hour": (3600, 3), "day": (86400, 4)}
UNIT_SECONDS = {enum: seconds for seconds, enum in UNITS.values()}


class StandInService:
    def __init__(self, clock, rules: dict[bytes, tuple[int, int]]):
        self.clock = clock
        self.rules = rules              # first entry key -> (limit, unit enum)
        self.counts: dict = {}

    def limit_for(self, entries, override):
        if entries and entries[0][0] in self.rules:
            return self.rules[entries[0][0]]
        if override is not None and override[1] in UNIT_SECONDS:
            return override
        return 1000, UNITS["minute"][1]

    def should_rate_limit(self, domain: bytes, descriptors: list, hits_addend: int):
        if domain == b"boom":
            raise RuntimeError("the stand-in service failed on purpose")
        if not domain:
            raise RlsError("rate limit domain must not be empty")
        if not descriptors:
            raise RlsError("rate limit descriptor list must not be empty")
        now_ms = self.clock.now()
        overall, statuses = 1, []
        for entries, override, hits in descriptors:
            limit, unit = self.limit_for(entries, override)
            window_ms = UNIT_SECONDS[unit] * 1000
            start = now_ms // window_ms * window_ms
            key = (domain, tuple(entries), start)
            count = self.counts.get(key, 0) + (hits if hits is not None else hits_addend or 1)
            self.counts[key] = count
            code = 2 if count > limit else 1
            overall = max(overall, code)
            name = b",".join(k for k, _ in entries)
            statuses.append((code, (limit, unit, name), max(0, limit - count),
                             (start + window_ms - now_ms) // 1000))
        headers = [(b"x-standin", b"over")] if overall == 2 else []
        return overall, statuses, headers


class StandInRls:
    """What server.rls holds: its .service decides."""

    def __init__(self, service):
        self.service = service


def parse_rule(text: str):
    key, _, spec = text.partition("=")
    n, _, unit = spec.partition("/")
    return key.encode(), (int(n), UNITS[unit][1])


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--standin-rule", type=parse_rule, action="append", default=[])
    ours, rest = p.parse_known_args(argv)
    settings = cfg.from_args(rest)
    setup_logging(settings.loglevel)

    async def serve():
        server = Server(settings)
        server.rls = StandInRls(StandInService(server.clock, dict(ours.standin_rule)))
        await server.start()
        await server.serve_until_stopped()

    loop = new_event_loop()
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


if __name__ == "__main__":
    main(sys.argv[1:])
